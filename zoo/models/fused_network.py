"""The FusedAttention network (after the FusedAttention write-up): N-dimensional inputs pooled by fused attention.

Two input forms, as in the write-up:
- one tensor (B, C, W1, ..., Wn) for any n >= 1, cut into patches with a window per
  dimension (the n-D convolution with kernel = stride, done for any n by a reshape
  and one linear map), giving L = prod(Wi / pi) tokens;
- a collection of L same-sized tensors (B, L, C, W1, ..., Wn), each item one token.
A few transformer blocks mix the tokens, FusedAttention pools them into one vector
(alpha, one weight per patch, is there for plots), and a linear head classifies.
With `patch_output=True`, g_V maps the pooled vector back to one patch (C, p1, ..., pn),
or one item's shape in the collection form, and the head reads that.

The 2-D networks are timm models too (zoo/models/backbone.py, zoo/release/timm_models.py); their
feature levels are the embedded patches and each block's output.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.attention import KV_CACHED, FusedAttention
from zoo.attention.fused import FUSES, NORMS
from zoo.models.arguments import classifier_arguments, flag, integer, transformer_sizes
from zoo.models.backbone import TokenBackbone
from zoo.models.classifier import Classifier
from zoo.models.layers import MLPS, POSITIONS, Block, check_choice, drop_path_rates, sincos_encoding
from zoo.models.pretrained import Releasable
from zoo.models.registry import register


# The two functions below read input shapes, which symbolic tracing (torch.fx, timm's feature extraction) cannot
# branch on: wrapped, each is one call in the traced graph and runs on the real tensor. Both return a tensor
# that the rest of the graph uses, so that dead-code elimination keeps them.
@torch.fx.wrap
def _checked_input(x: torch.Tensor, owner: str, expected: tuple[int, ...], collection: bool,
                   dynamic_patch: tuple[int, ...] | None) -> torch.Tensor:
    """x, if its shape is (batch, *expected), or with dynamic_patch (batch, C, W1..Wn) for any widths that are
    multiples of the patch's; else a ValueError naming the shape expected."""
    if dynamic_patch is not None:
        n = len(dynamic_patch)
        if x.dim() == n + 2 and x.shape[1] == expected[0] and all(
                w > 0 and w % p == 0 for w, p in zip(x.shape[2:], dynamic_patch)):
            return x
        raise ValueError(f"{owner} expects input (batch, {expected[0]}, {', '.join(f'W{i + 1}' for i in range(n))}) "
                         f"with widths that are multiples of the patch size {tuple(dynamic_patch)}, got "
                         f"{tuple(x.shape)}")
    if tuple(x.shape[1:]) != expected:
        names = "(batch, items, channels, widths...)" if collection else "(batch, channels, widths...)"
        raise ValueError(f"{owner} expects input {names} = (batch, {', '.join(map(str, expected))}), "
                         f"got {tuple(x.shape)}")
    return x


@torch.fx.wrap
def _positions_for(pos_embed: torch.Tensor, x: torch.Tensor, patch_size: tuple[int, ...], grid: tuple[int, ...],
                   learned: bool) -> torch.Tensor:
    """The position embedding for the patches of input x: learned 2-D positions resampled from `grid` by timm's
    resample_abs_pos_embed (bicubic, as timm's ViTs do), sin-cos ones computed for the new token count."""
    size = tuple(w // p for w, p in zip(x.shape[2:], patch_size))
    if size == tuple(grid):
        return pos_embed
    if learned:
        from timm.layers import resample_abs_pos_embed

        return resample_abs_pos_embed(pos_embed, list(size), list(grid), num_prefix_tokens=0)
    return sincos_encoding(math.prod(size), pos_embed.shape[-1])[None].to(pos_embed)


class FusedAttentionNetwork(TokenBackbone, Classifier, Releasable, nn.Module):
    """A classifier of N-dimensional inputs whose tokens FusedAttention pools into one vector.

    The input is one tensor (batch, in_chans, W1, ..., Wn), n >= 1, cut into L = prod(Wi / pi) patches, or
    with `collection` = L a collection (batch, L, in_chans, W1, ..., Wn), each item one token. Patches are
    embedded linearly, given positions, mixed by `depth` transformer blocks and pooled by FusedAttention,

        alpha = fuse(norm(K^T Q / sqrt(d))),   y = g_V(V alpha),

    and a linear head gives the logits (batch, num_classes). `attention_map` lays alpha out on the patch grid.

    Args:
        input_size: the input's widths (W1, ..., Wn) per spatial dimension, a list of ints >= 1, n >= 1
            (default (40,)); with `collection`, each item's widths.
        patch_size: the patch's widths (p1, ..., pn), one per input dimension, each dividing the input's
            (default (4,)); with `collection` each item is one whole patch and this is not used beyond its length.
        in_chans: the input's channels, an int >= 1 (default 1).
        num_classes: the number of classes, an int >= 0 (default 10); 0 gives no head, and the model returns
            the pooled vector.
        collection: 0 (default) for the one-tensor form; L >= 1 for a collection of L same-sized items.
        embed_dim: the token width, an int >= 1 divisible by `num_heads` (default 64).
        depth: the number of transformer blocks before the pooling, an int >= 0 (default 2).
        num_heads: the attention heads of each block and of the pooling, an int >= 1 (default 4).
        mlp_ratio: the MLP's hidden width as a multiple of embed_dim, a number in (0, 1024] giving at least one
            hidden unit (default 2); unused with mlp="ffn2".
        attention: the blocks' attention, bidirectional: "softmax" (default), "quiet", "clipped", "gated" or
            "micro" (see zoo.attention).
        mlp: the blocks' feed-forward: "mlp" (default; Linear, GELU, Linear) or "ffn2" (ELiTA's FeedForward2).
        pos_embed: the position encoding of the L tokens: "learned" (default), "sincos" (fixed 1-D sine-cosine,
            over the tokens in row-major grid order) or "none".
        norm: the pooling's normalization of each query's scores over the keys: "softmax" (default) or
            "softmax_one".
        fuse: the pooling's reduction over the queries: "mean" (default), "max" or "learned".
        patch_output: g_V maps the pooled vector back to one patch (in_chans * p1 * ... * pn values, or one
            item's with `collection`) and the head reads that; default False: g_V is the identity.
        drop_rate: the dropout probability, in [0, 1), on the MLPs, the softmax-family attention weights and
            before the head (default 0).
        drop_path_rate: the stochastic depth of the last block, in [0, 1), rising linearly from 0 at the first
            (default 0).
        final_norm: apply a LayerNorm to the tokens after the last block (default True).
        mean: the per-channel mean that `classify` and `preprocess` subtract from inputs: one value per
            channel, or one for all (default (0.0,)).
        std: the per-channel standard deviation they divide by, each in [1e-12, 1e12]: one value per channel,
            or one for all (default (1.0,)).
        label_names: the classes' names, a list of num_classes strings, shown by `classify`; default None
            (the class indices as strings).
        dynamic_img_size: accept inputs of any widths that are multiples of patch_size, the positions resampled
            from the input_size grid as timm's VisionTransformer does (learned ones on a 2-D grid only; sin-cos
            ones computed anew); not with `collection`. Default False: input_size only.
    """

    embedding_level = True  # two blocks in the tiny models: the embedded patches are feature level 0

    def __init__(
        self,
        input_size: tuple[int, ...] = (40,),
        patch_size: tuple[int, ...] = (4,),
        in_chans: int = 1,
        num_classes: int = 10,
        collection: int = 0,
        embed_dim: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        attention: str = "softmax",
        mlp: str = "mlp",
        pos_embed: str = "learned",
        norm: str = "softmax",
        fuse: str = "mean",
        patch_output: bool = False,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        final_norm: bool = True,
        mean: tuple[float, ...] = (0.0,),
        std: tuple[float, ...] = (1.0,),
        label_names: list[str] | None = None,
        dynamic_img_size: bool = False,
    ):
        super().__init__()
        owner = type(self).__name__
        for name, value in (("input_size", input_size), ("patch_size", patch_size)):
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise TypeError(f"{owner} {name} must be a list of integers (one per dimension), got {value!r}")
        input_size = tuple(integer(w, "input_size", owner) for w in input_size)
        patch_size = tuple(integer(w, "patch_size", owner) for w in patch_size)
        in_chans, num_classes = integer(in_chans, "in_chans", owner), integer(num_classes, "num_classes", owner, 0)
        collection = integer(collection, "collection", owner, 0)
        embed_dim, depth, num_heads, mlp_ratio, drop_rate = transformer_sizes(
            owner, embed_dim, depth, num_heads, mlp_ratio, drop_rate)
        drop_path_rate, mean, std, label_names = classifier_arguments(
            owner, in_chans, num_classes, drop_path_rate, mean, std, label_names)
        if len(input_size) < 1 or len(patch_size) != len(input_size):
            raise ValueError(f"{owner} needs one patch width per input dimension, got input_size={input_size}, "
                             f"patch_size={patch_size}")
        if collection:
            patch_size = input_size  # each item of the collection is one whole patch
        if any(w % p for w, p in zip(input_size, patch_size)):
            raise ValueError(f"{owner} needs input_size divisible by patch_size, got {input_size} and {patch_size}")
        check_choice(attention, (*KV_CACHED, "micro"), "attention", owner)
        check_choice(mlp, MLPS, "mlp", owner)
        check_choice(pos_embed, POSITIONS, "pos_embed", owner)
        check_choice(norm, tuple(NORMS), "norm", owner)  # names only: the config is JSON
        check_choice(fuse, FUSES, "fuse", owner)
        patch_output, final_norm = flag(patch_output, "patch_output", owner), flag(final_norm, "final_norm", owner)
        dynamic_img_size = flag(dynamic_img_size, "dynamic_img_size", owner)
        if dynamic_img_size and (collection or (pos_embed == "learned" and len(input_size) != 2)):
            raise ValueError(f"{owner} dynamic_img_size needs a 2-D input (learned positions are resampled on a 2-D "
                             f"grid) or sin-cos or no positions, and no collection; got input_size={input_size}, "
                             f"pos_embed={pos_embed!r}, collection={collection}")
        self.config = dict(
            input_size=list(input_size), patch_size=list(patch_size), in_chans=in_chans, num_classes=num_classes,
            collection=collection, embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
            attention=attention, mlp=mlp, pos_embed=pos_embed, norm=norm, fuse=fuse, patch_output=patch_output,
            drop_rate=drop_rate, drop_path_rate=drop_path_rate, final_norm=final_norm, mean=list(mean),
            std=list(std), label_names=label_names, dynamic_img_size=dynamic_img_size,
        )
        self.dynamic_img_size = dynamic_img_size
        self.input_size, self.patch_size, self.in_chans = input_size, patch_size, in_chans
        self.collection, self.num_classes, self.embed_dim = collection, num_classes, embed_dim
        self.grid = None if collection else tuple(w // p for w, p in zip(input_size, patch_size))
        self.num_tokens = collection or math.prod(self.grid)
        patch_numel = in_chans * math.prod(patch_size)

        self.patch_embed = nn.Linear(patch_numel, embed_dim)
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, self.num_tokens, embed_dim) * 0.02)
        elif pos_embed == "sincos":
            self.register_buffer("pos_embed", sincos_encoding(self.num_tokens, embed_dim)[None], persistent=False)
        else:
            self.pos_embed = None
        self.blocks = nn.Sequential(*[
            Block(embed_dim, num_heads, attention, mlp=mlp, mlp_ratio=mlp_ratio, max_len=self.num_tokens,
                  dropout=drop_rate, drop_path=rate)
            for rate in drop_path_rates(drop_path_rate, depth)
        ])
        self.norm = nn.LayerNorm(embed_dim) if final_norm else nn.Identity()
        g_v = nn.Linear(embed_dim, patch_numel) if patch_output else None
        self.pool = FusedAttention(embed_dim, heads=num_heads, norm=norm, fuse=fuse, g_v=g_v)
        self.num_features = embed_dim  # the tokens' width; the pooled vector's is head_hidden_size
        self._pooled_size = patch_numel if patch_output else embed_dim
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(self._pooled_size, num_classes) if num_classes else nn.Identity()

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.in_chans, *self.input_size)

    @property
    def expected_shape(self) -> tuple[int, ...]:
        item = (self.in_chans, *self.input_size)
        return (self.collection, *item) if self.collection else item

    @property
    def head_hidden_size(self) -> int:
        return self._pooled_size

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed"}

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, W1..Wn) -> (B, L, C * p1 * ... * pn), patches in row-major grid order."""
        b, n = x.shape[0], len(self.patch_size)
        if self.collection:
            return x.flatten(2)
        split = [b, self.in_chans]
        for i, p in enumerate(self.patch_size):  # the grid of this input: other sizes with dynamic_img_size
            split += [x.shape[2 + i] // p, p]
        x = x.reshape(split)
        grid_axes = [2 + 2 * i for i in range(n)]
        window_axes = [3 + 2 * i for i in range(n)]
        return x.permute(0, *grid_axes, 1, *window_axes).flatten(1, n).flatten(2)

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Input (batch, C, W1..Wn) or a collection (batch, items, C, W1..Wn) -> tokens (batch, L, embed_dim)."""
        images = _checked_input(x, type(self).__name__, self.expected_shape, bool(self.collection),
                                self.patch_size if self.dynamic_img_size else None)
        x = self.patch_embed(self.patchify(images))
        pos_embed = self.pos_embed
        if pos_embed is not None and self.dynamic_img_size:
            pos_embed = _positions_for(pos_embed, images, self.patch_size, self.grid,
                                       self.config["pos_embed"] == "learned")  # (a traced attribute is a Proxy)
        return x if pos_embed is None else x + pos_embed

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.run_blocks(self.embed_tokens(x)))

    def pooled(self, x: torch.Tensor, return_alpha: bool = False):
        """g_V(V alpha): (B, embed_dim), or (B, C, p1..pn) with patch_output; optionally alpha (B, heads, L)."""
        y, alpha = self.pool(self.forward_features(x), return_alpha=True) if return_alpha else \
            (self.pool(self.forward_features(x)), None)
        if self.config["patch_output"]:
            y = y.view(y.shape[0], self.in_chans, *self.patch_size)
        return (y, alpha) if return_alpha else y

    def attention_map(self, x: torch.Tensor) -> torch.Tensor:
        """alpha laid out on the patch grid: (B, heads, g1, ..., gn), or (B, heads, items)."""
        _, alpha = self.pooled(x, return_alpha=True)
        if self.collection:
            return alpha
        grid = [w // p for w, p in zip(x.shape[2:], self.patch_size)]  # this input's, with dynamic_img_size
        return alpha.view(alpha.shape[0], alpha.shape[1], *grid)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Tokens from forward_features -> the pooled vector (flattened; pre_logits) or the logits."""
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


TINY = dict(embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0)
register("fused-1d-tiny", "fused", FusedAttentionNetwork, input_size=(40,), patch_size=(4,), **TINY)
register("fused-2d-tiny", "fused", FusedAttentionNetwork, input_size=(28, 28), patch_size=(4, 4), **TINY)
register("fused-3d-tiny", "fused", FusedAttentionNetwork, input_size=(28, 28, 28), patch_size=(4, 4, 4),
         num_classes=2, **TINY)
register("fused-2d-small", "fused", FusedAttentionNetwork, input_size=(28, 28), patch_size=(4, 4),
         embed_dim=192, depth=6, num_heads=6, mlp_ratio=4.0)
