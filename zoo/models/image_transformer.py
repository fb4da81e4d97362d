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
from zoo.models.arguments import classifier_arguments, integer, transformer_sizes
from zoo.models.backbone import TokenBackbone
from zoo.models.classifier import Classifier
from zoo.models.layers import POSITIONS, Block, check_choice, drop_path_rates, sincos_encoding_2d
from zoo.registry import register
from zoo.release import Releasable

POOLS = ("token", "avg", "fused")


class ImageTransformer(TokenBackbone, Classifier, Releasable, nn.Module):
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
        check_choice(pos_embed, POSITIONS, "pos_embed", owner)
        check_choice(global_pool, POOLS, "global_pool", owner)
        if img_size % patch_size:
            raise ValueError(f"{owner} needs img_size divisible by patch_size, got {img_size} and {patch_size}")
        self.config = dict(
            img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
            embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio, attention=attention,
            mlp=mlp, pos_embed=pos_embed, learned_bias=learned_bias, global_pool=global_pool,
            drop_rate=drop_rate, drop_path_rate=drop_path_rate, final_norm=bool(final_norm), mean=list(mean),
            std=list(std), label_names=label_names,
        )
        self.img_size, self.in_chans, self.global_pool = img_size, in_chans, global_pool
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
        """Images (batch, C, H, W) -> tokens with their positions (batch, prefix + patches, embed_dim)."""
        expected = (self.in_chans, self.img_size, self.img_size)
        if x.dim() != 4 or tuple(x.shape[1:]) != expected:
            raise ValueError(f"{type(self).__name__} expects images of shape (batch, {', '.join(map(str, expected))}),"
                             f" got {tuple(x.shape)}")
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
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
