"""ImageTransformer: a ViT-style classifier (after SciFormer's image transformer), with timm's model API.

Patch embedding is a convolution with kernel = stride, so any number of input channels
works; then a learned position embedding or a fixed 2-D sin-cos encoding, transformer
blocks whose attention is softmax, quiet, clipped, gated, (bidirectional) micro or
in-context, one for all blocks or one per block (a hybrid), and a classifier on the class
token, the mean token or a FusedAttention pooling of the tokens.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from zoo.attention import KV_CACHED, FusedAttention
from zoo.models.arguments import classifier_arguments, flag, integer, transformer_sizes
from zoo.models.backbone import TokenBackbone
from zoo.models.classifier import Classifier
from zoo.models.layers import (
    MLPS,
    POSITIONS,
    Block,
    check_choice,
    checked_block_options,
    drop_path_rates,
    per_block,
    sincos_encoding_2d,
)
from zoo.models.pretrained import Releasable
from zoo.models.registry import register

POOLS = ("token", "avg", "fused")
# the bidirectional token mixers (elita is causal only)
ATTENTIONS = (*KV_CACHED, "micro", "incontext")


# The two functions below read input shapes, which symbolic tracing (torch.fx, timm's feature extraction) cannot
# branch on: wrapped, each is one call in the traced graph and runs on the real tensor. Both return a tensor
# that the rest of the graph uses, so that dead-code elimination keeps them.
@torch.fx.wrap
def _checked_images(x: torch.Tensor, owner: str, in_chans: int, img_size: int, patch: int,
                    dynamic: bool) -> torch.Tensor:
    """x, if it is a batch of images the model takes; else a ValueError naming the expected shape."""
    if dynamic:
        fits = x.dim() == 4 and x.shape[1] == in_chans and x.shape[2] % patch == 0 and x.shape[3] % patch == 0 \
            and min(x.shape[2:]) > 0
        expected = f"(batch, {in_chans}, H, W) with H and W multiples of the patch size {patch}"
    else:
        fits = x.dim() == 4 and tuple(x.shape[1:]) == (in_chans, img_size, img_size)
        expected = f"(batch, {in_chans}, {img_size}, {img_size})"
    if not fits:
        raise ValueError(f"{owner} expects images of shape {expected}, got {tuple(x.shape)}")
    return x


@torch.fx.wrap
def _positions_for(pos_embed: torch.Tensor, patches: torch.Tensor, grid: tuple[int, int], num_prefix_tokens: int,
                   learned: bool) -> torch.Tensor:
    """The position embedding for the grid of `patches` (batch, dim, h, w): learned positions resampled from
    `grid` by timm's resample_abs_pos_embed (bicubic, prefix tokens kept), sin-cos ones computed anew."""
    size = tuple(patches.shape[2:])
    if size == tuple(grid):
        return pos_embed
    if learned:
        from timm.layers import resample_abs_pos_embed

        return resample_abs_pos_embed(pos_embed, list(size), list(grid), num_prefix_tokens)
    table = sincos_encoding_2d(*size, pos_embed.shape[-1]).to(pos_embed)
    return torch.cat([pos_embed[0, :num_prefix_tokens], table])[None]


class ImageTransformer(TokenBackbone, Classifier, Releasable, nn.Module):
    """A ViT-style image classifier whose attention is chosen by name, with timm's model API.

    Images (batch, in_chans, img_size, img_size) are cut into (img_size / patch_size)^2 patches by a
    convolution (kernel = stride = patch_size), given positions, passed through `depth` pre-norm transformer
    blocks and pooled into logits (batch, num_classes). `forward_features` gives the tokens
    (batch, prefix + patches, embed_dim), `forward_head` the logits, `classify` (label, probability) pairs
    from PIL images, arrays or tensors, normalized with `mean` and `std`.

    Args:
        img_size: the images' height and width in pixels, an int >= 1 divisible by `patch_size` (default 28).
        patch_size: the patches' side in pixels, an int >= 1 (default 4: 49 patches of a 28 x 28 image).
        in_chans: the images' channels, an int >= 1 (default 1, grayscale).
        num_classes: the number of classes, an int >= 0 (default 10); 0 gives no head, and the model returns
            its pooled features (batch, embed_dim).
        embed_dim: the token width, an int >= 1 divisible by `num_heads` (and by 4 with pos_embed="sincos");
            default 128.
        depth: the number of transformer blocks, an int >= 0 (default 6).
        num_heads: the attention heads per block, an int >= 1 (default 4).
        mlp_ratio: the MLP's hidden width as a multiple of embed_dim, a number in (0, 1024] giving at least one
            hidden unit (default 4); unused with mlp="ffn2".
        attention: the blocks' attention, bidirectional: "softmax" (default), "quiet", "clipped", "gated",
            "micro" or "incontext" (see zoo.attention); one name for every block, or a list of `depth` names,
            one per block (a hybrid, e.g. ["micro", "micro", "softmax", "micro"]).
        mlp: the blocks' feed-forward: "mlp" (default; Linear, GELU, Linear) or "ffn2" (ELiTA's FeedForward2);
            one name, or a list of `depth` names.
        attention_options: the mechanisms' own arguments: None (default), one dict for every block, or a list of
            `depth` dicts (None for none), e.g. {"num_queries": 8} for micro, {"alpha": 2.0} for clipped,
            {"num_positions": 32} for incontext, {"dropout": 0.1} for the softmax family and incontext; JSON
            values, kept in `config` as given. An option the block's mechanism does not take is refused.
        pos_embed: the position encoding added to the tokens: "learned" (default), "sincos" (fixed 2-D sine-
            cosine) or "none". Whatever the blocks' attentions, it is added once, at the input, and reaches every
            block through the residual stream; an incontext block adds its own positions, counted from the
            activations, on top of it (with pos_embed="none", those are the only positions).
        learned_bias: give each block's attention a learned (query, key) bias per head (SciFormer's trainable
            mask); only where every block's attention is softmax, quiet, clipped or gated, and not with
            dynamic_img_size. Default False.
        global_pool: how the tokens become one vector: "token" (default; a class token), "avg" (their mean) or
            "fused" (a FusedAttention pooling).
        drop_rate: the dropout probability, in [0, 1), on the MLPs, the softmax-family attention weights and
            before the head (default 0); incontext's attention weights take theirs from attention_options.
        drop_path_rate: the stochastic depth of the last block, in [0, 1), rising linearly from 0 at the first
            (default 0).
        final_norm: apply a LayerNorm to the tokens after the last block (default True).
        mean: the per-channel mean that `classify` and `preprocess` subtract from inputs in [0, 1]: one value
            per channel, or one for all (default (0.5,)).
        std: the per-channel standard deviation they divide by, each in [1e-12, 1e12]: one value per channel,
            or one for all (default (0.5,)).
        label_names: the classes' names, a list of num_classes strings, shown by `classify`; default None
            (the class indices as strings).
        dynamic_img_size: accept any height and width that are multiples of patch_size, resampling the
            positions from the img_size grid as timm's VisionTransformer does (default False: img_size only).
    """

    def __init__(
        self,
        img_size: int = 28,
        patch_size: int = 4,
        in_chans: int = 1,
        num_classes: int = 10,
        embed_dim: int = 128,
        depth: int = 6,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        attention: str | list[str] = "softmax",
        mlp: str | list[str] = "mlp",
        attention_options: dict | list[dict | None] | None = None,
        pos_embed: str = "learned",
        learned_bias: bool = False,
        global_pool: str = "token",
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        final_norm: bool = True,
        mean: tuple[float, ...] = (0.5,),
        std: tuple[float, ...] = (0.5,),
        label_names: list[str] | None = None,
        dynamic_img_size: bool = False,
    ):
        super().__init__()
        owner = type(self).__name__
        img_size, patch_size = integer(img_size, "img_size", owner), integer(patch_size, "patch_size", owner)
        in_chans, num_classes = integer(in_chans, "in_chans", owner), integer(num_classes, "num_classes", owner, 0)
        embed_dim, depth, num_heads, mlp_ratio, drop_rate = transformer_sizes(
            owner, embed_dim, depth, num_heads, mlp_ratio, drop_rate)
        drop_path_rate, mean, std, label_names = classifier_arguments(
            owner, in_chans, num_classes, drop_path_rate, mean, std, label_names)
        attentions = per_block(attention, depth, ATTENTIONS, "attention", owner)
        mlps = per_block(mlp, depth, MLPS, "mlp", owner)
        options = checked_block_options(attention_options, attentions, owner)
        check_choice(pos_embed, POSITIONS, "pos_embed", owner)
        check_choice(global_pool, POOLS, "global_pool", owner)
        learned_bias, final_norm = flag(learned_bias, "learned_bias", owner), flag(final_norm, "final_norm", owner)
        for index, name in enumerate(attentions):
            if learned_bias and name not in KV_CACHED:
                raise ValueError(f"{owner} learned_bias needs one of {list(KV_CACHED)} attentions in every block; "
                                 f"block {index} has attention {name!r}")
        if attention_options is not None:  # as config.json will hold it (tuples as lists)
            attention_options = json.loads(json.dumps(attention_options))
        dynamic_img_size = flag(dynamic_img_size, "dynamic_img_size", owner)
        if img_size % patch_size:
            below, above = img_size - img_size % patch_size, img_size - img_size % patch_size + patch_size
            raise ValueError(f"{owner} needs img_size divisible by patch_size, got {img_size} and {patch_size} "
                             f"(the nearest are {' and '.join(str(n) for n in (below, above) if n)})")
        if dynamic_img_size and learned_bias:  # the bias covers (max_len, max_len) token pairs of one size
            raise ValueError(f"{owner} dynamic_img_size needs learned_bias=False: the learned attention bias "
                             "covers the tokens of one image size")
        self.config = dict(
            img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
            attention=attention if isinstance(attention, str) else attentions,
            mlp=mlp if isinstance(mlp, str) else mlps, pos_embed=pos_embed, learned_bias=learned_bias,
            global_pool=global_pool, drop_rate=drop_rate, drop_path_rate=drop_path_rate, final_norm=final_norm,
            mean=list(mean), std=list(std), label_names=label_names, dynamic_img_size=dynamic_img_size,
        )
        if attention_options is not None:  # absent otherwise: a single-name model's config.json is as before
            self.config["attention_options"] = attention_options
        self.img_size, self.in_chans, self.global_pool = img_size, in_chans, global_pool
        self.dynamic_img_size = dynamic_img_size
        self.num_classes, self.num_features, self.embed_dim = num_classes, embed_dim, embed_dim
        grid = img_size // patch_size
        self.grid, self.patch_size = (grid, grid), (patch_size, patch_size)
        self.num_prefix_tokens = 1 if global_pool == "token" else 0
        num_tokens = grid * grid + self.num_prefix_tokens

        self.patch_embed = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if self.num_prefix_tokens else None
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, num_tokens, embed_dim) * 0.02)
        elif pos_embed == "sincos":
            table = sincos_encoding_2d(grid, grid, embed_dim)
            table = torch.cat([torch.zeros(self.num_prefix_tokens, embed_dim), table])
            self.register_buffer("pos_embed", table[None], persistent=False)
        else:
            self.pos_embed = None
        blocks = []
        for index, rate in enumerate(drop_path_rates(drop_path_rate, depth)):
            try:  # an option's value the mechanism refuses (num_queries=0): say which block
                blocks.append(Block(embed_dim, num_heads, attentions[index], causal=False, mlp=mlps[index],
                                    mlp_ratio=mlp_ratio, max_len=num_tokens, learned_bias=learned_bias,
                                    dropout=drop_rate, drop_path=rate, attention_options=options[index]))
            except (ValueError, TypeError) as error:
                raise type(error)(f"{owner} block {index} ({attentions[index]} attention): {error}") from None
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.LayerNorm(embed_dim) if final_norm else nn.Identity()
        self.pool = FusedAttention(embed_dim, heads=num_heads) if global_pool == "fused" else None
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_chans, self.img_size, self.img_size)

    @property
    def head_hidden_size(self) -> int:
        return self.embed_dim

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token"}

    def _check_global_pool(self, global_pool: str | None) -> None:
        if global_pool is not None and global_pool != self.global_pool:
            raise ValueError(f"global_pool is fixed at build time ({self.global_pool!r}), got {global_pool!r}")

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Images (batch, C, H, W) -> tokens with their positions (batch, prefix + patches, embed_dim).

        H and W are img_size, or with dynamic_img_size any multiples of the patch size, whose
        positions are resampled from the model's grid (as timm's VisionTransformer does)."""
        x = _checked_images(x, type(self).__name__, self.in_chans, self.img_size, self.patch_size[0],
                            self.dynamic_img_size)
        x = self.patch_embed(x)
        pos_embed = self.pos_embed
        if pos_embed is not None and self.dynamic_img_size:
            pos_embed = _positions_for(pos_embed, x, self.grid, self.num_prefix_tokens,
                                       self.config["pos_embed"] == "learned")  # (a traced attribute is a Proxy)
        x = x.flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if pos_embed is not None:
            x = x + pos_embed
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.run_blocks(self.embed_tokens(x)))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "token":
            x = x[:, 0]
        elif self.global_pool == "avg":
            x = x.mean(1)
        else:
            x = self.pool(x)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


# img 28, patch 4: 49 tokens. tiny ~0.8M parameters (a 3 MB checkpoint), small ~6.4M.
TINY = dict(embed_dim=128, depth=4, num_heads=4, mlp_ratio=3.0)
SMALL = dict(embed_dim=256, depth=8, num_heads=8, mlp_ratio=4.0)
for attention, prefix in (("softmax", "vit"), ("quiet", "quiet-vit"), ("micro", "micro-vit")):
    for size, dims in (("tiny", TINY), ("small", SMALL)):
        register(f"{prefix}-{size}", "image", ImageTransformer, default_tag="mnist", attention=attention, **dims)
register("fused-pool-vit-tiny", "image", ImageTransformer, global_pool="fused", **TINY)
# the controls of Bondarenko et al. 2023 for the outlier study: clipped softmax and gated attention
for attention in ("clipped", "gated"):
    register(f"{attention}-vit-tiny", "image", ImageTransformer, attention=attention, **TINY)
# The image hybrid: one softmax block among micro ones, and the in-context attention. The softmax block is the last, as
# in the text hybrids (zoo/models/text_transformer.py says what was measured); for MNIST it is untested.
HYBRID_SOFTMAX_BLOCK = 3
HYBRID_MICRO = ["softmax" if i == HYBRID_SOFTMAX_BLOCK else "micro" for i in range(TINY["depth"])]
register("hybrid-micro-vit-tiny", "image", ImageTransformer, attention=HYBRID_MICRO, **TINY)
register("incontext-vit-tiny", "image", ImageTransformer, attention="incontext", **TINY)
