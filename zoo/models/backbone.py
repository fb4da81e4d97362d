"""timm's model contract, shared by the two image families (ImageTransformer, FusedAttentionNetwork).

A model that mixes this in embeds its input into tokens (`embed_tokens`: (batch, prefix +
patches, embed_dim)), runs them through `blocks` and `norm`, and lays its patch tokens out
on `grid`. From that this class gives what timm's tools expect of a model: `pretrained_cfg`
(alias `default_cfg`) describing how its inputs were prepared in training, `feature_info`,
`forward_intermediates` and `prune_intermediate_layers` (which timm's `features_only=True`
wrapper calls), `set_grad_checkpointing`, `get_classifier` and `reset_classifier`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.models.arguments import flag, integer
from zoo.models.layers import take_indices


class TokenBackbone:
    config: dict
    blocks: nn.Sequential
    norm: nn.Module
    head: nn.Module
    embed_dim: int
    num_classes: int
    input_shape: tuple[int, ...]
    grid: tuple[int, ...] | None  # the patch grid; None where tokens have no layout (a collection)
    patch_size: tuple[int, ...]
    num_prefix_tokens = 0
    embedding_level = False  # whether the embedded patches are feature level 0, before the blocks
    grad_checkpointing = False
    _pretrained_cfg: dict | None = None

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def head_hidden_size(self) -> int:
        """The width of `forward_head(..., pre_logits=True)`: what the classifier reads."""
        raise NotImplementedError

    # ---- configuration ----------------------------------------------------------------------

    def data_cfg(self) -> dict:
        """How this model's inputs were prepared in training, in timm's pretrained_cfg keys.

        The shipped models were trained on images at their stored size: no resize and no crop
        (crop_pct=1.0), only scaling to [0, 1] and normalizing. `interpolation` is what
        `preprocess` uses to resize other sizes.
        """
        c = self.config
        names = c.get("label_names")
        return {
            "input_size": tuple(self.input_shape), "mean": tuple(c["mean"]), "std": tuple(c["std"]),
            "crop_pct": 1.0, "crop_mode": "center", "interpolation": "bilinear",
            "num_classes": self.num_classes, "classifier": "head", "first_conv": "patch_embed",
            "label_names": tuple(names) if names else None,
        }

    @property
    def pretrained_cfg(self) -> dict:
        """timm's description of the weights: the one timm set at creation, else `data_cfg()`."""
        return self._pretrained_cfg if self._pretrained_cfg is not None else self.data_cfg()

    @pretrained_cfg.setter
    def pretrained_cfg(self, cfg: dict) -> None:
        self._pretrained_cfg = cfg

    default_cfg = pretrained_cfg  # timm's older name for the same thing

    @property
    def feature_info(self) -> list[dict]:
        reduction = self.patch_size[0] if len(set(self.patch_size)) == 1 else tuple(self.patch_size)
        levels = (["patch_embed"] if self.embedding_level else []) + [f"blocks.{i}" for i in range(len(self.blocks))]
        return [{"module": name, "num_chs": self.embed_dim, "reduction": reduction} for name in levels]

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups (layer-wise learning-rate decay): the embedding, each block, then the rest."""
        return {"stem": r"^cls_token|^pos_embed|^patch_embed",
                "blocks": r"^blocks\.(\d+)" if coarse else [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]}

    # ---- position embedding at another image size ------------------------------------------

    def stored_grid(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The square patch grid of a learned position embedding stored with `shape` for another image size,
        which loading resamples to this model's grid; a ValueError if it cannot be one of this model's."""
        prefix, grid = self.num_prefix_tokens, self.grid
        tokens = shape[1] - prefix if len(shape) == 3 else 0
        side = math.isqrt(max(tokens, 0))
        if grid is None or len(grid) != 2 or shape[0] != 1 or shape[2] != self.embed_dim or side * side != tokens \
                or tokens == 0:
            raise ValueError(f"{type(self).__name__} resamples a stored pos_embed of shape (1, {prefix} + n * n, "
                             f"{self.embed_dim}), from a square grid of patches to its own {grid}; got {tuple(shape)}")
        return side, side

    def resample_pos_embed(self, pos_embed: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """A learned position embedding for the patch grid `grid`, resampled to this model's as timm resamples a
        ViT's when it loads weights for another img_size (bicubic, antialiased; prefix tokens kept as they are)."""
        from timm.layers import resample_abs_pos_embed

        return resample_abs_pos_embed(pos_embed, list(self.grid), list(grid), self.num_prefix_tokens)

    # ---- classifier ---------------------------------------------------------------------------

    def get_classifier(self) -> nn.Module:
        return self.head

    def _check_global_pool(self, global_pool: str | None) -> None:
        if global_pool is not None:
            raise ValueError(f"{type(self).__name__} has no choice of global pooling; got global_pool={global_pool!r}")

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new classifier for num_classes (0: none, the model returns pooled features), made on the
        model's device and in its dtype and training mode."""
        self._check_global_pool(global_pool)
        num_classes = integer(num_classes, "num_classes", type(self).__name__, 0)
        param = next(self.parameters())
        self.num_classes = self.config["num_classes"] = num_classes
        self.config["label_names"] = None
        head = nn.Identity()
        if num_classes:
            head = nn.Linear(self.head_hidden_size, num_classes, device=param.device, dtype=param.dtype)
        self.head = head.train(self.training)

    # ---- blocks ------------------------------------------------------------------------------

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them."""
        self.grad_checkpointing = flag(enable, "set_grad_checkpointing enable", type(self).__name__)

    def run_block(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block, x, use_reentrant=False)
        return block(x)

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.run_block(block, x)
        return x

    def _level(self, x: torch.Tensor, output_fmt: str, grid: tuple[int, ...]) -> torch.Tensor:
        x = x[:, self.num_prefix_tokens:]
        if output_fmt == "NLC":
            return x
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *grid).contiguous()

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """The feature levels of `feature_info` picked by `indices` (None: all; n: the last n; or a list),
        each as NCHW (batch, embed_dim, *grid) or NLC (batch, patches, embed_dim) without prefix tokens,
        optionally through the final norm; and, unless intermediates_only, forward_features' output.
        stop_early skips the blocks after the last level asked for."""
        owner = type(self).__name__
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"{owner}.forward_intermediates output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        if output_fmt == "NCHW" and self.grid is None:
            raise ValueError(f"{owner} takes a collection of items, whose tokens have no grid: use output_fmt='NLC'")
        take, last = take_indices(len(self.feature_info), indices, owner)
        stages = ([None] if self.embedding_level else []) + list(self.blocks)
        if stop_early:
            stages = stages[: last + 1]
        grid = self.grid
        if getattr(self, "dynamic_img_size", False):  # the grid of these images
            grid = tuple(w // p for w, p in zip(x.shape[2:], self.patch_size))
        x = self.embed_tokens(x)
        intermediates = []
        for i, block in enumerate(stages):
            if block is not None:
                x = self.run_block(block, x)
            if i in take:
                intermediates.append(self._level(self.norm(x) if norm else x, output_fmt, grid))
        return intermediates if intermediates_only else (self.norm(x), intermediates)

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks after the last level in `indices` (and the final norm, and the classifier), as
        timm's feature wrapper asks; the config follows, so a pruned model saves and reloads as it is."""
        take, last = take_indices(len(self.feature_info), indices, type(self).__name__)
        keep = last + 1 - int(self.embedding_level)
        self.blocks = self.blocks[:keep]
        self.config["depth"] = keep
        if prune_norm:
            self.norm = nn.Identity()
            self.config["final_norm"] = False
        if prune_head:
            self.reset_classifier(0)
        return take
