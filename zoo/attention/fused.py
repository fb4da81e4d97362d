"""FusedAttention (the FusedAttention write-up): attention that pools L tokens into one vector.

    Q = f_Q(X), K = f_K(X), V = f_V(X)
    alpha = fuse(norm(K^T Q / sqrt(d)))      (L keys x 1)
    Y = g_V(V alpha)

norm normalizes each query's column of scores over the keys (softmax by default,
softmax_one as an option, or any callable(scores, dim)); fuse reduces over the
queries (mean by default, max, a learned weighting, or any
callable(weights, query_weights)). d is the per-head key width: the write-up
divides by the square root of the value width d, which is the key width only when
the two agree; the usual scaling is by the key width.

With fuse = mean (or the learned weighting) and norm = softmax or softmax_one,
V alpha = sum_q w_q (sum_k norm(s)_kq V_k): a weighted mean over queries of ordinary
attention outputs. That runs through the fused SDPA kernel in O(L) memory, so the
L x L matrix is only built when alpha itself is asked for (plots) or fuse = max.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from zoo.attention.dot_product import attend
from zoo.attention.quiet import softmax_one
from zoo.utils.checks import check_heads, check_padding_mask, check_tokens, flag, shown, zero_padding

NORMS: dict[str, Callable] = {"softmax": torch.softmax, "softmax_one": softmax_one}
FUSES = ("mean", "max", "learned")


class FusedAttention(nn.Module):
    """Pools (batch, length, dim) tokens into g_V of a (batch, dim) vector (the FusedAttention write-up).

    For each head, with d the per-head key width (dim / heads):

        Q = f_Q(X), K = f_K(X), V = f_V(X)
        alpha = fuse(norm(K^T Q / sqrt(d)))      (one weight per key: L x 1)
        Y = g_V(V alpha)

    norm normalizes each query's scores over the keys; fuse reduces over the queries. With the defaults
    (softmax, mean), alpha_j = (1/L) sum_q softmax_j(q . k / sqrt(d)), so V alpha is the mean of ordinary
    attention outputs and runs through the fused SDPA kernel in O(L) memory; the L x L matrix is built
    only for `return_alpha=True`, `alpha()`, fuse="max" or a callable.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens
    (padded tokens are neither keys nor queries); returns (batch, dim), zeros for a row with no real
    token, or (y, alpha) with alpha (batch, heads, length) when called with `return_alpha=True`.

    What we fixed in the write-up: it divides the scores by the square root of the value width; we divide by
    the square root of the key width, as usual (the two agree only when the widths do).

    Args:
        dim: the token width, an int >= 1 divisible by `heads`; also the pooled vector's width before g_V.
        heads: the number of heads, an int >= 1 (default 1), each with its own alpha.
        causal: must be False (the default): pooling every token into one vector sees the whole sequence;
            True is a ValueError.
        norm: how a query's scores become weights over the keys: "softmax" (default), "softmax_one", or a
            callable(scores, dim) taking scores (batch, heads, queries, keys) and dim=-1.
        fuse: how the queries' weights become alpha: "mean" (default), "max", "learned" (a softmax over
            the queries of a learned linear score of each token, per head), or a callable(weights,
            query_weights) taking weights (batch, heads, queries, keys) and the mean's query weights
            (batch, heads, queries), returning alpha (batch, heads, keys).
        f_q: the module computing the queries from x (batch, length, dim) -> (batch, length, dim); default
            None, a Linear(dim, dim).
        f_k: the keys' module, as f_q; default None, a Linear(dim, dim).
        f_v: the values' module, as f_q; default None, a Linear(dim, dim).
        g_v: the module applied to the pooled (batch, dim) vector; default None, the identity.
        bias: whether the default f_q, f_k, f_v Linear layers have biases (default True).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        causal: bool = False,
        norm: str | Callable = "softmax",
        fuse: str | Callable = "mean",
        f_q: nn.Module | None = None,
        f_k: nn.Module | None = None,
        f_v: nn.Module | None = None,
        g_v: nn.Module | None = None,
        bias: bool = True,
    ):
        super().__init__()
        if flag(causal, "causal", "FusedAttention"):
            raise ValueError("FusedAttention pools all tokens into one vector, so it cannot be causal; got causal=True")
        flag(bias, "bias", "FusedAttention")
        for name, value, names in (("norm", norm, sorted(NORMS)), ("fuse", fuse, list(FUSES))):
            if not (value in names if isinstance(value, str) else callable(value)):
                error = ValueError if isinstance(value, str) else TypeError
                raise error(f"FusedAttention {name} must be one of {names} or a callable, got {shown(value)}")
        self.head_dim = check_heads(dim, heads, type(self).__name__)
        self.dim, self.heads, self.norm, self.fuse = dim, heads, norm, fuse
        self.f_q = f_q if f_q is not None else nn.Linear(dim, dim, bias=bias)
        self.f_k = f_k if f_k is not None else nn.Linear(dim, dim, bias=bias)
        self.f_v = f_v if f_v is not None else nn.Linear(dim, dim, bias=bias)
        self.g_v = g_v if g_v is not None else nn.Identity()
        self.query_score = nn.Linear(dim, heads) if fuse == "learned" else None

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.head_dim).transpose(1, 2)

    def _query_weights(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """How much each query counts in the fuse, (B, H, L), summing to 1 over real queries."""
        b, n, _ = x.shape
        if self.query_score is not None:
            logits = self.query_score(x).transpose(1, 2).float()
        else:
            logits = x.new_zeros(b, self.heads, n, dtype=torch.float32)
        if key_padding_mask is None:
            return logits.softmax(-1)
        logits = logits.masked_fill(~key_padding_mask[:, None, :], float("-inf"))
        # a row that is all padding has no query to weigh: zeros, where softmax would give NaN
        return logits.softmax(-1).masked_fill(~key_padding_mask.any(-1)[:, None, None], 0.0)

    def alpha(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The attention vector alpha (batch, heads, length), built from the full score matrix.

        Args:
            x: the tokens, (batch, length, dim).
            key_padding_mask: (batch, length) bool, True for real tokens, or None (default): all real.
                Padded tokens get alpha 0.
        """
        check_tokens(x, self.dim, type(self).__name__)
        key_padding_mask = check_padding_mask(key_padding_mask, x, type(self).__name__)
        return self._alpha(zero_padding(x, key_padding_mask), key_padding_mask)

    def _alpha(self, x, key_padding_mask):
        q, k = self._heads(self.f_q(x)), self._heads(self.f_k(x))
        scores = (q.float() @ k.float().transpose(-1, -2)) * self.head_dim**-0.5  # (B, H, queries, keys)
        if key_padding_mask is not None:
            scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
        norm = NORMS[self.norm] if isinstance(self.norm, str) else self.norm
        weights = norm(scores, dim=-1)
        if key_padding_mask is not None:  # zeros, not NaN, where a row has no real key at all
            weights = weights.masked_fill(~key_padding_mask[:, None, None, :], 0.0)
        query_weights = self._query_weights(x, key_padding_mask)
        if callable(self.fuse):
            return self.fuse(weights, query_weights)
        if self.fuse == "max":
            real = (query_weights > 0)[..., None]
            return weights.masked_fill(~real, 0.0).amax(-2)
        return (query_weights[..., None] * weights).sum(-2)

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, return_alpha: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_tokens(x, self.dim, type(self).__name__)
        key_padding_mask = check_padding_mask(key_padding_mask, x, type(self).__name__)
        x = zero_padding(x, key_padding_mask)
        b = x.shape[0]
        v = self._heads(self.f_v(x))
        fusable = self.fuse in ("mean", "learned") and self.norm in ("softmax", "softmax_one")
        alpha = None
        if fusable and not return_alpha:
            q, k = self._heads(self.f_q(x)), self._heads(self.f_k(x))
            out = attend(q, k, v, key_padding_mask=key_padding_mask, quiet=self.norm == "softmax_one")
            weights = self._query_weights(x, key_padding_mask).to(out.dtype)
            pooled = (weights[..., None] * out).sum(-2)
        else:
            alpha = self._alpha(x, key_padding_mask)
            pooled = (alpha.to(v.dtype)[..., None] * v).sum(-2)
        y = self.g_v(pooled.reshape(b, self.dim))
        if key_padding_mask is not None:  # a row that is all padding pools to zeros
            y = zero_padding(y[:, None], key_padding_mask.any(-1, keepdim=True))[:, 0]
        return (y, alpha) if return_alpha else y
