"""Pictures of what the models hold and what their attention does (after SciFormer's weight visualizations).

    from zoo.viz import capture, pictures
    with capture(model) as maps:          # attention weights, recomputed only inside the context
        model(x)
    for name, (figure, numbers) in pictures(model, x).items():
        figure.savefig(f"{name}.png")

`measures` computes the numbers, `figures` draws them (tensors in, a Figure out), `capture`
records attention; `pictures` puts them together for a model and one input. Needs matplotlib
(`pip install 'attention-zoo[viz]'`).
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("matplotlib") is None:
    raise ImportError("zoo.viz draws with matplotlib, which is not installed: pip install 'attention-zoo[viz]'")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from zoo.viz import figures, measures  # noqa: E402
from zoo.viz.capture import AttentionMap, capture  # noqa: E402

__all__ = ["AttentionMap", "MAX_TOKENS", "capture", "figures", "measures", "pictures"]

MAX_TOKENS = 1024  # of a prompt: its attention maps take layers x heads x MAX_TOKENS^2 values


def _grid(model) -> tuple[int, ...] | None:
    return getattr(model, "grid", None)


def _stack(maps: list[AttentionMap], key: str | None = None) -> torch.Tensor:
    """Item 0 of each layer's weights (or extra[key]): (layers, heads, ...)."""
    return torch.stack([(m.weights if key is None else m.extra[key])[0] for m in maps])


def check_input(model: nn.Module, x: torch.Tensor) -> None:
    """One input as the model takes it, batch of one; else a ValueError naming the shape the model takes."""
    if hasattr(model, "vocab_size"):
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != 1 or x.is_floating_point():
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"pictures take one prompt as token ids of shape (1, length), got {got}")
        if not 0 < x.shape[1] <= MAX_TOKENS:  # capture holds (layers, heads, L, L) maps
            raise ValueError(f"pictures take prompts of 1 to {MAX_TOKENS:,} tokens (each layer's map is tokens x "
                             f"tokens per head), got {x.shape[1]:,}: draw a part of the prompt")
        return
    shape = tuple(getattr(model, "expected_shape", model.input_shape))
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != (1, *shape):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"pictures take one input of shape (1, {', '.join(map(str, shape))}) for "
                         f"{type(model).__name__}, got {got}; model.preprocess makes one from an image or array")
    if not x.is_floating_point() or not bool(torch.isfinite(x).all()):
        raise ValueError(f"pictures take a finite floating-point input, got {x.dtype}"
                         + ("" if not x.is_floating_point() else " holding NaN or infinite values"))


@torch.no_grad()
def pictures(model: nn.Module, x: torch.Tensor | None = None, include_model: bool = True,
             query: int | None = None) -> dict[str, tuple]:
    """Every picture that applies to `model` (unless include_model=False), and to one input `x` (a batch
    of one, as the model takes it) if given: name -> (Figure, the numbers drawn, as arrays).
    `query`: the patch whose row of the learned mask is drawn over the grid (default: the centre one)."""
    out: dict[str, tuple] = {}
    grid = _grid(model)
    if include_model:
        out.update(_model_pictures(model, grid, query))
    if x is None:
        return out
    out.update(_input_pictures(model, x, grid))
    return out


def _model_pictures(model: nn.Module, grid, query: int | None = None) -> dict[str, tuple]:
    out = {}
    learned_mask = any(getattr(m, "attn_bias", None) is not None for m in model.modules())
    over_grid = learned_mask and grid is not None and len(grid) == 2  # one query patch's row, drawn over the grid
    if over_grid:  # the query patch, checked before anything is drawn
        patches = grid[0] * grid[1]
        query = (grid[0] // 2) * grid[1] + grid[1] // 2 if query is None else query
        if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < patches:
            raise ValueError(f"query must be a patch index in [0, {patches}) on the {grid[0]} x {grid[1]} grid, "
                             f"got {query!r}")
    if getattr(model, "patch_embed", None) is not None:
        filters = measures.patch_filters(model)
        out["patch_filters"] = (figures.filters_figure(filters), {"filters": filters.numpy()})
        components = measures.principal_filters(filters)
        out["patch_filters_pca"] = (figures.filters_figure(components, "principal components of the filters"),
                                    {"components": components.numpy()})
    if model.config.get("pos_embed") == "learned":
        similarity = measures.position_similarity(measures.position_table(model))
        out["position_similarity"] = (figures.similarity_figure(similarity, grid), {"similarity": similarity.numpy()})
    if learned_mask:
        bias = measures.learned_bias(model)  # (layers, heads, L, L)
        labels = [f"layer {i} head {h}" for i in range(bias.shape[0]) for h in range(bias.shape[1])]
        out["learned_mask"] = (figures.heatmaps_figure(bias.flatten(0, 1), labels, title="learned attention mask"),
                               {"bias": bias.numpy()})
        if over_grid:
            prefix = getattr(model, "num_prefix_tokens", 0)
            row = bias[:, :, prefix + query, prefix:]  # (layers, heads, patches)
            out["learned_mask_query"] = (figures.heatmaps_figure(row.flatten(0, 1), labels, grid,
                                                                 f"learned mask of query patch {query} over the grid"),
                                         {"bias": row.numpy(), "query": query})
    return out


def _input_pictures(model: nn.Module, x: torch.Tensor, grid) -> dict[str, tuple]:
    out = {}
    check_input(model, x)
    was_training = model.training
    with capture(model) as maps:
        model.eval()(x)  # the weights of inference: no dropout
    model.train(was_training)
    square = [m for m in maps if m.weights is not None]
    if square:
        weights = _stack(square)  # (layers, heads, L, L)
        labels = [f"{m.layer} head {h}" for m in square for h in range(weights.shape[1])]
        prefix = getattr(model, "num_prefix_tokens", 0)
        if grid is not None and len(grid) == 2:  # where each head looks, averaged over the query patches
            looked_at = weights[..., prefix:, prefix:].mean(-2).flatten(0, 1)
            out["attention"] = (figures.heatmaps_figure(looked_at, labels, grid, "attention received, per layer "
                                                        "and head (mean over queries)"), {"weights": weights.numpy()})
            rolled = measures.rollout([m.weights[:1] for m in square])[0]  # (L, L)
            received = rolled[0, prefix:] if prefix else rolled[prefix:, prefix:].mean(0)
            image = x[0] if x.dim() == 4 else None
            if image is not None:
                out["rollout"] = (figures.overlay_figure(image, received, grid, "attention rollout"),
                                  {"rollout": rolled.numpy()})
            patch = model.patch_size[0]
            distance = torch.stack([measures.mean_attention_distance(m.weights[:1], grid, patch, prefix)
                                    for m in square])
            out["attention_distance"] = (figures.per_head_figure(distance, "mean attention distance (pixels)",
                                                                 "mean attention distance"),
                                         {"distance": distance.numpy()})
        else:
            out["attention"] = (figures.heatmaps_figure(weights.flatten(0, 1), labels,
                                                        title="attention weights (query x key)"),
                                {"weights": weights.numpy()})
        if hasattr(model, "vocab_size"):
            ids = x[0].tolist()
            tokens = [model.tokenizer.decode([t]) for t in ids] if model.tokenizer else [str(t) for t in ids]
            out["attention_tokens"] = (figures.token_figure(tokens, weights[-1].mean(0),
                                                            "last layer, mean over heads"),
                                       {"weights": weights[-1].mean(0).numpy()})
    incontext = [m for m in maps if m.kind == "incontext"]
    if incontext:  # the bias the activations made, per layer and head (query x key, first input)
        bias = torch.stack([m.extra["bias"][0] for m in incontext])  # (layers, heads, L, L)
        labels = [f"{m.layer} head {h}" for m in incontext for h in range(bias.shape[1])]
        out["incontext_bias"] = (figures.heatmaps_figure(bias.flatten(0, 1), labels,
                                                         title="in-context position bias (query x key)"),
                                 {"bias": bias.numpy(),
                                  "positions": torch.stack([m.extra["positions"][0] for m in incontext]).numpy()})
    quiet = [m for m in maps if "nothing" in m.extra]
    if quiet:
        nothing = torch.stack([m.extra["nothing"][0].mean(-1) for m in quiet])  # (layers, heads)
        out["quiet_nothing"] = (figures.per_head_figure(nothing, "mass on nothing (1 - row sum)",
                                                        f"{quiet[0].kind} attention: weight given to nothing"),
                                {"nothing": _stack(quiet, "nothing").numpy()})
    gated = [m for m in maps if "gate" in m.extra and m.kind == "gated"]
    if gated:
        gates = torch.stack([m.extra["gate"][0].mean(-1) for m in gated])  # (layers, heads)
        out["gates"] = (figures.per_head_figure(gates, "mean gate sigmoid(G(x))", "gated attention: how much of "
                                                "each head passes"), {"gate": _stack(gated, "gate").numpy()})
    micro = [m for m in maps if m.kind == "micro"]
    if micro and grid is not None and len(grid) == 2:
        prefix = getattr(model, "num_prefix_tokens", 0)
        scores = _stack(micro, "scores")[..., prefix:]  # (layers, heads, patches)
        labels = [f"{m.layer} head {h}" for m in micro for h in range(scores.shape[1])]
        out["micro_saliency"] = (figures.heatmaps_figure(scores.flatten(0, 1), labels, grid,
                                                         "micro attention scores s_t"), {"scores": scores.numpy()})
    fused = [m for m in maps if m.kind == "fused"]
    if fused:
        alpha = fused[-1].extra["alpha"][0]  # (heads, L)
        shaped = alpha if grid is None else alpha.view(alpha.shape[0], *grid)
        source = x[0] if getattr(model, "collection", 0) == 0 and x.dim() > 2 else None
        out["fused_alpha"] = (figures.alpha_figure(shaped, source), {"alpha": alpha.numpy()})
    return out
