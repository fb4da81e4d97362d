"""ImageTransformer: a ViT-style classifier (sciformer.md's image transformer), with timm's model API.

Patch embedding is a convolution with kernel = stride, so any number of input channels
works; then a learned position embedding or a fixed 2-D sin-cos encoding, transformer
blocks whose attention is softmax, quiet or (bidirectional) micro, and a classifier on
the class token, the mean token or a FusedAttention pooling of the tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.attention import KV_CACHED, FusedAttention
from zoo.models.arguments import classifier_arguments, flag, integer, transformer_sizes
from zoo.models.backbone import TokenBackbone
from zoo.models.classifier import Classifier
from zoo.models.layers import MLPS, POSITIONS, Block, check_choice, drop_path_rates, sincos_encoding_2d
from zoo.models.pretrained import Releasable
from zoo.models.registry import register

POOLS = ("token", "avg", "fused")


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
        attention: the blocks' attention, bidirectional: "softmax" (default), "quiet", "clipped", "gated" or
            "micro" (see zoo.attention).
        mlp: the blocks' feed-forward: "mlp" (default; Linear, GELU, Linear) or "ffn2" (ELiTA's FeedForward2).
        pos_embed: the position encoding added to the tokens: "learned" (default), "sincos" (fixed 2-D sine-
            cosine) or "none".
        learned_bias: give each block's attention a learned (query, key) bias per head (sciformer.md's trainable
            mask); only for the softmax, quiet, clipped and gated attentions, and not with dynamic_img_size.
            Default False.
        global_pool: how the tokens become one vector: "token" (default; a class token), "avg" (their mean) or
            "fused" (a FusedAttention pooling).
        drop_rate: the dropout probability, in [0, 1), on the MLPs, the softmax-family attention weights and
            before the head (default 0).
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
        attention: str = "softmax",
        mlp: str = "mlp",
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
        check_choice(attention, (*KV_CACHED, "micro"), "attention", owner)
        check_choice(mlp, MLPS, "mlp", owner)
        check_choice(pos_embed, POSITIONS, "pos_embed", owner)
        check_choice(global_pool, POOLS, "global_pool", owner)
        learned_bias, final_norm = flag(learned_bias, "learned_bias", owner), flag(final_norm, "final_norm", owner)
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
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, attention=attention,
            mlp=mlp, pos_embed=pos_embed, learned_bias=learned_bias, global_pool=global_pool,
            drop_rate=drop_rate, drop_path_rate=drop_path_rate, final_norm=final_norm, mean=list(mean),
            std=list(std), label_names=label_names, dynamic_img_size=dynamic_img_size,
        )
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
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, attention, causal=False, mlp=mlp, mlp_ratio=mlp_ratio,
                  max_len=num_tokens, learned_bias=learned_bias, dropout=drop_rate, drop_path=rate)
            for rate in drop_path_rates(drop_path_rate, depth)
        ])
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
# the controls of Bondarenko et al. 2023 for the outlier study (issue 13): clipped softmax and gated attention
for attention in ("clipped", "gated"):
    register(f"{attention}-vit-tiny", "image", ImageTransformer, attention=attention, **TINY)
