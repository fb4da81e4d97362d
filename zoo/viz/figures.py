"""Figures from tensors: each function takes the numbers (zoo/viz/measures.py, zoo/viz/capture.py)
and returns a matplotlib Figure; nothing here reads a model or writes a file."""

from __future__ import annotations

import math

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _subplots(rows: int = 1, cols: int = 1, *, figsize: tuple[float, float], squeeze: bool = True):
    """A Figure and its axes, made outside pyplot: pyplot would keep every figure alive until closed, and
    choosing its backend here would switch the caller's (closing their open figures). The figure draws
    itself through its own Agg canvas, to a file or to an RGB array, whatever backend the caller uses."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=squeeze)


def _grid_of(count: int, columns: int | None = None) -> tuple[int, int]:
    columns = columns or math.ceil(math.sqrt(count))
    return math.ceil(count / columns), columns


def _panels(count: int, size: float = 1.2, columns: int | None = None, title: str = ""):
    rows, cols = _grid_of(count, columns)
    fig, axes = _subplots(rows, cols, figsize=(cols * size, rows * size + 0.4), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig, list(axes.flat)


def _filter_image(f: np.ndarray) -> np.ndarray:
    """One filter (C, *patch) as an image: gray, colour for 3 channels, a 3-D filter's middle slices side by side."""
    if f.ndim == 4:  # (C, D, H, W): the middle slice on each axis, first channel
        v = f[0]
        return np.concatenate([v[v.shape[0] // 2], v[:, v.shape[1] // 2], v[:, :, v.shape[2] // 2]], axis=1)
    if f.shape[0] == 3:
        rgb = np.moveaxis(f, 0, -1)
        return (rgb - rgb.min()) / max(float(np.ptp(rgb)), 1e-12)
    return f[0]


def filters_figure(filters: torch.Tensor, title: str = "patch embedding filters", limit: int = 64) -> Figure:
    """The first `limit` filters (embed_dim, C, *patch): curves for 1-D patches, images for 2-D (colour with
    three channels), three middle slices for 3-D."""
    f = filters[:limit].numpy()
    fig, axes = _panels(len(f), title=title)
    for ax, filt in zip(axes, f):
        if filt.ndim == 2:  # 1-D patches: one curve per channel
            ax.axis("on")
            ax.set_xticks([]), ax.set_yticks([])
            for channel in filt:
                ax.plot(channel, linewidth=0.8)
        else:
            image = _filter_image(filt)
            ax.imshow(image, cmap=None if image.ndim == 3 else "gray")
    return fig


def similarity_figure(similarity: torch.Tensor, grid: tuple[int, ...] | None = None,
                      title: str = "position embedding similarity") -> Figure:
    """Cosine similarities (N, N): on a 2-D patch grid, each patch's row as a small grid at its place
    (ViT Figure 7, centre); otherwise the N x N matrix."""
    sim = similarity.numpy()
    if grid is None or len(grid) != 2:
        fig, ax = _subplots(figsize=(4.5, 4))
        shown = ax.imshow(sim, cmap="viridis", vmin=-1, vmax=1)
        ax.set_xlabel("position"), ax.set_ylabel("position"), ax.set_title(title, fontsize=9)
        fig.colorbar(shown, ax=ax)
        return fig
    rows, cols = grid
    fig, axes = _subplots(rows, cols, figsize=(cols * 0.7, rows * 0.7 + 0.4), squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.imshow(sim[i].reshape(rows, cols), cmap="viridis", vmin=-1, vmax=1)
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    return fig


def heatmaps_figure(maps: torch.Tensor, labels: list[str], grid: tuple[int, ...] | None = None,
                    title: str = "", cmap: str = "magma") -> Figure:
    """One heat map per label: maps (K, N, M) as matrices, or (K, N) laid out on a 2-D grid."""
    m = maps.numpy()
    fig, axes = _panels(len(m), size=1.8, columns=min(len(m), 8), title=title)
    for ax, values, label in zip(axes, m, labels):
        image = values.reshape(grid) if values.ndim == 1 and grid is not None and len(grid) == 2 else values
        if image.ndim == 1:
            ax.axis("on")
            ax.plot(image)
        else:
            ax.imshow(image, cmap=cmap)
        ax.set_title(label, fontsize=7)
    return fig


def overlay_figure(image: torch.Tensor, values: torch.Tensor, grid: tuple[int, int], title: str = "") -> Figure:
    """A per-patch map (N,) upsampled over a 2-D image (C, H, W)."""
    img = image.float()
    picture = img[0].numpy() if img.shape[0] == 1 else np.moveaxis(img[:3].numpy(), 0, -1)
    v = values.reshape(1, 1, *grid).float()
    up = torch.nn.functional.interpolate(v, size=tuple(img.shape[-2:]), mode="nearest")[0, 0].numpy()
    fig, axes = _subplots(1, 2, figsize=(5, 2.6))
    axes[0].imshow(picture, cmap="gray")
    axes[1].imshow(picture, cmap="gray")
    axes[1].imshow(up, cmap="jet", alpha=0.5)
    for ax in axes:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    return fig


def per_head_figure(values: torch.Tensor, ylabel: str, title: str) -> Figure:
    """A scatter of one number per (layer, head): values (layers, heads), depth on the x axis (ViT Figure 7, right)."""
    v = values.numpy()
    fig, ax = _subplots(figsize=(4.5, 3))
    for head in range(v.shape[1]):
        ax.scatter(np.arange(v.shape[0]), v[:, head], s=14, label=f"head {head}")
    ax.set_xlabel("layer"), ax.set_ylabel(ylabel), ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)
    return fig


def alpha_figure(alpha: torch.Tensor, x: torch.Tensor | None = None, title: str = "fused attention alpha") -> Figure:
    """alpha for one input, shaped (heads, *grid), whatever the grid's rank: a curve per head over a signal,
    a heat map per head over an image, the three middle slices through a volume per head."""
    a = alpha.float().numpy()
    heads, rank = a.shape[0], a.ndim - 1
    if rank == 1:
        fig, ax = _subplots(figsize=(5, 2.8))
        if x is not None:
            signal = x.float().reshape(-1).numpy()
            ax.plot(np.linspace(0, len(a[0]) - 1, len(signal)), signal / max(np.abs(signal).max(), 1e-12) * a.max(),
                    color="0.7", linewidth=0.8, label="input (scaled)")
        for h in range(heads):
            ax.plot(a[h], label=f"head {h}")
        ax.set_xlabel("patch"), ax.set_ylabel("alpha"), ax.legend(fontsize=6), ax.set_title(title, fontsize=9)
        return fig
    if rank == 2:
        return heatmaps_figure(alpha.float(), [f"head {h}" for h in range(heads)], title=title, cmap="viridis")
    slices = []
    for h in range(heads):
        v = a[h].reshape(a.shape[1], a.shape[2], -1)
        slices += [v[v.shape[0] // 2], v[:, v.shape[1] // 2], v[:, :, v.shape[2] // 2]]
    fig, axes = _panels(len(slices), size=1.6, columns=3, title=title + " (middle slice on each axis, per head)")
    for ax, s in zip(axes, slices):
        ax.imshow(s, cmap="viridis")
    return fig


def token_figure(tokens: list[str], weights: torch.Tensor, title: str = "attention over the prompt") -> Figure:
    """A token-by-token heat map (L, L) with the tokens on both axes."""
    n = len(tokens)
    fig, ax = _subplots(figsize=(max(3, n * 0.25 + 1), max(3, n * 0.25 + 0.8)))
    ax.imshow(weights.float().numpy(), cmap="magma")
    shown = [repr(t)[1:-1] for t in tokens]
    ax.set_xticks(range(n), shown, fontsize=6, rotation=90)
    ax.set_yticks(range(n), shown, fontsize=6)
    ax.set_xlabel("key"), ax.set_ylabel("query"), ax.set_title(title, fontsize=9)
    return fig


def lines_figure(series: dict[str, tuple[list, list]], xlabel: str, ylabel: str, title: str,
                 log: bool = True) -> Figure:
    """One line per label through its (x, y) points, on log-log axes unless log=False."""
    fig, ax = _subplots(figsize=(5.2, 3.4))
    for label, (x, y) in series.items():
        ax.plot(x, y, marker="o", markersize=3, label=label)
    if log:
        ax.set_xscale("log"), ax.set_yscale("log")
    ax.set_xlabel(xlabel), ax.set_ylabel(ylabel), ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def line_panels_figure(panels: dict[str, dict[str, tuple[list, list]]], xlabel: str, title: str) -> Figure:
    """Panels side by side on linear axes, one per y label, each with one line per label through its (x, y)
    points: several measures of the same runs against a shared x (training step, say)."""
    fig, axes = _subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (ylabel, series) in zip(axes[0], panels.items()):
        for label, (x, y) in series.items():
            ax.plot(x, y, marker="o", markersize=2, label=label)
        ax.set_xlabel(xlabel), ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return fig


def bars_figure(groups: list[str], series: dict[str, list[float]], ylabel: str, title: str) -> Figure:
    """Grouped bars: one group per label in `groups`, one bar per series."""
    fig, ax = _subplots(figsize=(max(5.2, len(groups) * 0.9), 3.4))
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        ax.bar(np.arange(len(groups)) + i * width, values, width, label=label)
    ax.set_xticks(np.arange(len(groups)) + width * (len(series) - 1) / 2, groups, fontsize=7, rotation=20)
    ax.set_ylabel(ylabel), ax.set_title(title, fontsize=9), ax.legend(fontsize=7)
    return fig


def scatter_figure(points: dict[str, tuple[float, float]], xlabel: str, ylabel: str, title: str) -> Figure:
    """Labelled points, x on a log axis (parameters)."""
    fig, ax = _subplots(figsize=(5.2, 3.4))
    for label, (x, y) in points.items():
        ax.scatter([x], [y], s=18)
        ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log"), ax.set_xlabel(xlabel), ax.set_ylabel(ylabel), ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    return fig
