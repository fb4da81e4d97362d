"""The numbers behind the pictures: what a model holds (filters, positions, its learned mask) and
what is measured from captured attention (rollout, mean attention distance). Tensors in, tensors out.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _name(model: nn.Module) -> str:
    return getattr(model, "model_name", None) or type(model).__name__


def patch_filters(model: nn.Module) -> torch.Tensor:
    """The first layer's filters, (embed_dim, channels, *patch): a ViT's convolution, or a FusedAttention
    network's linear map over flattened patches, unflattened."""
    embed = getattr(model, "patch_embed", None)
    if embed is None:
        has = "token embeddings (a text model)" if hasattr(model, "tok_embed") else "no patch embedding"
        raise ValueError(f"{_name(model)} has {has}; patch filters are drawn for the image and fused models")
    weight = embed.weight.detach().float()
    if weight.dim() == 2:  # FusedAttentionNetwork: (embed_dim, C * p1 * ... * pn)
        item = model.input_size if model.collection else model.patch_size
        weight = weight.view(weight.shape[0], model.in_chans, *item)
    return weight


def principal_filters(filters: torch.Tensor, count: int = 28) -> torch.Tensor:
    """The leading principal components of the filters, each shaped as one filter (ViT Figure 7, left)."""
    flat = filters.flatten(1).double()
    _, _, vh = torch.linalg.svd(flat - flat.mean(0), full_matrices=False)
    return vh[:count].view(-1, *filters.shape[1:]).float()


def position_table(model: nn.Module) -> torch.Tensor:
    """The learned position embedding of each patch or position, (positions, dim), prefix tokens left out."""
    kind = model.config.get("pos_embed")
    if kind != "learned" or getattr(model, "pos_embed", None) is None:
        raise ValueError(f"{_name(model)} has {kind!r} positions, not learned ones: there is no position "
                         "embedding to compare (sin-cos encodings are fixed, 'none' has none)")
    table = model.pos_embed.detach().float()
    table = table[0] if table.dim() == 3 else table
    return table[getattr(model, "num_prefix_tokens", 0):]


def position_similarity(table: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every position's embedding with every other's, (N, N)."""
    unit = table / table.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(table.dtype).tiny)
    return unit @ unit.T


def learned_bias(model: nn.Module) -> torch.Tensor:
    """SciFormer's trainable mask of every layer, (layers, heads, L, L)."""
    biases = [m.attn_bias.detach().float() for m in model.modules() if getattr(m, "attn_bias", None) is not None]
    if not biases:
        raise ValueError(f"{_name(model)} has no learned attention mask: build it with learned_bias=True "
                         f"(softmax or quiet attention); its attention is {model.config.get('attention')!r}")
    return torch.stack(biases)


def rollout(weights: list[torch.Tensor]) -> torch.Tensor:
    """Attention rollout (Abnar and Zuidema 2020): each layer's head-mean weights with the residual added,
    0.5 W + 0.5 I, rows renormalized, multiplied from the first layer up; (B, L, L)."""
    result = None
    for w in weights:
        w = w.double().mean(1)
        eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
        w = 0.5 * w + 0.5 * eye
        w = w / w.sum(-1, keepdim=True)
        result = w if result is None else w @ result
    return result.float()


def grid_distances(grid: tuple[int, ...], patch: int | float = 1) -> torch.Tensor:
    """Euclidean distance between the centres of every two patches of a grid, in pixels, (N, N)."""
    axes = torch.meshgrid(*[torch.arange(g, dtype=torch.float64) for g in grid], indexing="ij")
    centres = torch.stack([a.flatten() for a in axes], -1) * patch
    return torch.cdist(centres, centres)


def mean_attention_distance(weights: torch.Tensor, grid: tuple[int, ...], patch: int | float = 1,
                            prefix: int = 0) -> torch.Tensor:
    """Per head, the distance in pixels between a query patch and the patches it attends to, weighted by
    the attention and averaged over queries and the batch (ViT, Figure 7 right and appendix D.7); (H,).
    Prefix tokens (a class token) are left out, and each query's weights over patches renormalized."""
    w = weights[..., prefix:, prefix:].double()
    w = w / w.sum(-1, keepdim=True).clamp_min(1e-300)
    distance = grid_distances(grid, patch).to(w.device)
    if w.shape[-1] != distance.shape[0]:
        raise ValueError(f"weights over {w.shape[-1]} patches do not fit a grid of {grid} ({math.prod(grid)})")
    return (w * distance).sum(-1).mean((0, 2)).float()
