"""In-context attention: softmax attention with a position bias made from the activations (the open
TODO of SciFormer's write-up, "use activations to create bias terms, b = W_x x").

Two linear maps of the activations make the bias. Each token t gets a gate per head,

    g_t = sigmoid(w_g . x_t + b_g),

and a query i counts the gates between itself and a key j, inclusive, as that key's contextual position:

    p_ij = sum_{t=j..i} g_t = c_i - c_{j-1},    c = cumsum(g)     (j <= i; for j > i, sum_{t=i..j} g_t)

Each query also reads a bias table over contextual positions from its own activations, B_i = W_b x_i
(num_positions entries per head), and the logit of key j is

    s_ij = q_i . k_j / sqrt(d) + interp(B_i, p_ij),

interp interpolating B_i linearly between floor(p) and ceil(p), p clamped to num_positions - 1 (CoPE's
interpolation, Golovneva et al. 2024, "Contextual Position Encoding"). Softmax over the allowed keys, the
values and the output projection are SoftmaxAttention's.

Why this form: both parts of the bias come from the activations, and with every gate at 1 it is a
relative position bias (p_ij = i - j + 1) whose table each query chooses, so "the previous token" can be
wanted by some queries and not others, which a fixed position encoding cannot make depend on content; the
gates let a token (a separator, a word's last piece) count as a position while others do not. CoPE's
gates sigmoid(q_i . k_t) depend on the query: an L x L gate matrix and a cumulative sum per query row.
Ours depend on the token alone, so the positions cost one cumulative sum (O(L)) and decoding carries a
running sum; the price is that every query counts the same tokens. The bias is (L x L) per head, as CoPE's is,
but it need not be stored: each entry is a difference of two running sums and a read of the query's table.

Three routes compute the same numbers, each held to the others and to a float64 loop by tests/test_incontext.py:

- fused (incontext_kernel.py, csrc/incontext_attention.cpp): on the CPU with no padding, attn_mask or dropout,
  causal or not, i.e. a model's training step and forward; in float32 (half-precision q, k, v, as a bf16 autocast
  makes them, are widened to it and the output narrowed back). Flash attention's blocked online softmax with
  the bias computed block by block from the O(L) sums and tables, forward and backward: no (L x L) tensor,
  memory O(L). It is chosen wherever it runs, in `forward` below, because it was the faster at every length
  measured (bench/incontext_bias.py, one thread, an AVX-512 CPU shared with another training run: the training
  step of incontext-gpt-tiny against gpt-tiny's, 1.04x at 500 tokens and 1.05x at 512 against 2.4x on the bias
  mask, 1.12x against 2.98x at 784, 1.00x against 5.05x at 4,096 with 100 MiB of peak memory against 2,176;
  at 64 and 128 tokens the two are within the noise of a 5-round run, and 15 rounds gave 1.30x against 1.38x
  at 64, 1.26x against 1.44x at 128; bench/results/incontext_bias.json has the latest figures).
- bias mask, compiled (csrc/incontext_bias.cpp, see native.py): on the CPU elsewhere (padding, attn_mask,
  dropout, decoding with `step`, `position_bias`; in half precision its tables are float32): the bias written as an
  (L x L) float attn_mask for PyTorch's SDPA (dot_product.py) in one pass, its gradient read in one; SDPA takes
  its math kernel, since the mask needs a gradient.
- bias mask, eager (`_positions`, `_interpolate`): everything else (float64, other devices, ONNX export,
  `native.eager_routes()`): about thirty passes over (B, H, L, L) tensors.

torch.compile and torch.export see the fused route as one operator, zoo::incontext_attention (with its backward);
ONNX has no translation of it, so an ONNX export takes the eager bias mask (native._exporting_to_onnx). PyTorch's
FlexAttention, a score_mod reading the sums and tables, would be the portable form of the fused route, but in
torch 2.14 it has no backward on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import zoo.attention.incontext_kernel as incontext_kernel
import zoo.attention.native as native
from zoo.attention.dot_product import attend, autocast_off, check_attn_mask
from zoo.utils.checks import (
    check_heads,
    check_padding_mask,
    check_state,
    check_tokens,
    flag,
    integer,
    number,
    zero_padding,
)


@dataclass
class InContextState:
    """The state of a causal InContextAttention between calls of `step`: a KV cache and the gate sums.

    Pass None to start, then the state each call returns. `step` grows it by concatenation.

    Args:
        keys: the keys of the tokens seen so far, (batch, heads, seen, head_dim), in the layer's dtype.
        values: their values, of the same shape, dtype and device as `keys`.
        starts: c_{j-1}, the sum of the gates before each cached key j, (batch, heads, seen), in float32
            (float64 for float64 inputs).
        total: c, the sum of the gates of every token seen, (batch, heads), in the dtype of `starts`.
        mask: (batch, seen) bool, True where a cached token is real (False: padding, never attended);
            None: every token is real.
    """

    keys: torch.Tensor
    values: torch.Tensor
    starts: torch.Tensor
    total: torch.Tensor
    mask: torch.Tensor | None = None


class InContextAttention(nn.Module):
    """Multi-head softmax attention with an in-context position bias (SciFormer's b = W_x x).

    For each head, with q, k, v the head's slices of W_qkv x, d = dim / heads, per-token gates
    g_t = sigmoid(w_g . x_t + b_g), c = cumsum(g) and per-query tables B_i = W_b x_i + b_b:

        p_ij = sum of g_t over t between j and i inclusive  (= c_i - c_{j-1} for j <= i, c_j - c_{i-1} for j > i)
        head = softmax(q_i . k_j / sqrt(d) + interp(B_i, min(p_ij, num_positions - 1))) v,   y = W_o concat(heads)

    interp(B, p) = (1 - w) B[floor p] + w B[ceil p], w = p - floor p (CoPE's interpolation, Golovneva et al.
    2024). With every gate at 1, p_ij = i - j + 1: a relative position bias whose table each query picks
    from its own activations. Unlike CoPE, whose gates sigmoid(q_i . k_t) depend on the query (an L x L
    gate matrix, a cumulative sum per query row), these gates depend on the token alone: the positions cost
    one cumulative sum, O(L), and decoding keeps a running sum; the price is that every query counts the
    same tokens. Padded tokens are never attended and their gates count 0. W_b starts at zero, so a new
    layer is plain softmax attention and its positions are learnt.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions. A causal layer also decodes with
    `y, state = layer.step(x_new, state)` and an InContextState, starting from `state=None`.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1); each head is dim / heads wide.
        causal: True: token i attends to tokens 0..i only, and `step` decodes; default False (bidirectional).
        bias: whether the qkv and output projections have biases (default True).
        dropout: the dropout probability on the attention weights while training, in [0, 1) (default 0).
        num_positions: the entries of each query's bias table, an int in [1, 2^20] (default 64); contextual
            positions beyond num_positions - 1 share its last entry.
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = False, bias: bool = True, dropout: float = 0.0,
                 num_positions: int = 64):
        super().__init__()
        owner = type(self).__name__
        self.head_dim = check_heads(dim, heads, owner)
        causal, bias = flag(causal, "causal", owner), flag(bias, "bias", owner)
        dropout = number(dropout, "dropout", owner, maximum=1.0, include_maximum=False)
        num_positions = integer(num_positions, "num_positions", owner, maximum=2**20)
        self.dim, self.heads, self.causal, self.dropout = dim, heads, causal, dropout
        self.num_positions = num_positions
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.gate = nn.Linear(dim, heads)  # w_g, b_g: one gate per token and head
        self.table = nn.Linear(dim, heads * num_positions)  # W_b, b_b: one bias table per query and head
        nn.init.zeros_(self.table.weight)
        nn.init.zeros_(self.table.bias)

    def _wide(self, x: torch.Tensor) -> torch.dtype:
        return torch.promote_types(x.dtype, torch.float32)  # gates, counts and tables: at least float32

    def _gates(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """g (batch, heads, length), zero at padding, in at least float32: a count of bf16 gates is exact to
        only 3 significant digits."""
        wide = self._wide(x)
        with autocast_off(x.device):
            g = torch.sigmoid(F.linear(x.to(wide), self.gate.weight.to(wide), self.gate.bias.to(wide)))
        if key_padding_mask is not None:
            g = g * key_padding_mask[..., None]
        return g.transpose(1, 2)

    def _tables(self, x: torch.Tensor) -> torch.Tensor:
        """B (batch, heads, length, num_positions), in at least float32."""
        b, n, _ = x.shape
        wide = self._wide(x)
        with autocast_off(x.device):
            tables = F.linear(x.to(wide), self.table.weight.to(wide), self.table.bias.to(wide))
        return tables.view(b, n, self.heads, self.num_positions).transpose(1, 2)

    def _interpolate(self, tables: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """interp(B_i, p_ij): tables (batch, heads, Lq, P), positions (batch, heads, Lq, Lk) -> (..., Lq, Lk)."""
        positions = positions.clamp(0, self.num_positions - 1)
        floor = positions.floor()
        weight = positions - floor  # the gradient reaches the gates through here (floor's is zero)
        low = floor.long()
        high = (low + 1).clamp(max=self.num_positions - 1)
        return torch.lerp(tables.gather(-1, low), tables.gather(-1, high), weight)

    def positions(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """The contextual positions p_ij (batch, heads, L, L): the gates summed from key j to query i inclusive,
        in at least float32, before clamping to num_positions - 1.

        Args:
            x: the tokens, (batch, length, dim).
            key_padding_mask: (batch, length) bool, True for real tokens; padded tokens count 0.
        """
        x, key_padding_mask = self._checked(x, key_padding_mask)
        return self._positions(self._gates(x, key_padding_mask))

    def _checked(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None):
        """x checked and zeroed at padding, and the checked mask: the pictures' inputs, as forward's."""
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        return zero_padding(x, key_padding_mask), key_padding_mask

    def _bias(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None, causal: bool = False) -> torch.Tensor:
        """interp(B_i, p_ij) of checked, zeroed tokens; causal: -inf at the keys after each query, so that the
        bias is the causal mask too (and the attention need not apply one)."""
        tables, gates = self._tables(x), self._gates(x, key_padding_mask)
        if native.usable(tables, (torch.float32,)):
            ends = gates.cumsum(-1)  # csrc/incontext_bias.cpp: one pass, no (L x L) intermediates
            return native.incontext_bias(ends, ends - gates, tables, causal)
        bias = self._interpolate(tables, self._positions(gates))
        if causal:
            n = x.shape[1]
            later = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            bias = bias.masked_fill(later, float("-inf"))
        return bias

    @staticmethod
    def _positions(gates: torch.Tensor) -> torch.Tensor:
        ends = gates.cumsum(-1)  # c_t
        starts = ends - gates  # c_{t-1}
        n = gates.shape[-1]
        later = torch.arange(n, device=gates.device)[None, :] > torch.arange(n, device=gates.device)[:, None]
        behind = ends[..., :, None] - starts[..., None, :]  # c_i - c_{j-1}, the count for j <= i
        # for j > i the count is c_j - c_{i-1}, the transpose; clamped at 0 against rounding
        return torch.where(later, behind.mT, behind).clamp(min=0)

    def position_bias(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """interp(B_i, p_ij), the bias added to the logits, (batch, heads, L, L) in at least float32, for
        pictures (zoo.viz); no mask applied (the causal and padding masks act on top of it).

        Args:
            x: the tokens, (batch, length, dim).
            key_padding_mask: (batch, length) bool, True for real tokens; padded tokens count 0.
        """
        return self._bias(*self._checked(x, key_padding_mask))

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        # The heads side by side, (B, L, H * d), by concatenation rather than transpose-and-reshape: with a per-row
        # bias PyTorch's CPU kernel returns its heads laid out (B, L, H, d), torch.export records that reshape as a
        # view, and its own decomposition (ONNX export) then cannot take it. A concatenation has no layout to assume.
        return self.proj(torch.cat(out.unbind(1), dim=-1))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        """Self-attention over x (batch, length, dim) with the in-context position bias.

        Args:
            x: the tokens, (batch, length, dim).
            key_padding_mask: (batch, length) bool, True for real tokens; padded keys are never attended, their
                gates count 0, and their outputs are zero.
            attn_mask: as timm and F.scaled_dot_product_attention take it, (length, length) or
                (batch or 1, heads or 1, length, length): bool, True where the query may attend, or float,
                added to the logits (-inf forbids).
            is_causal: True: attend causally for this call, as a causal layer always does.

        Returns:
            (batch, length, dim).
        """
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        causal = self.causal or flag(is_causal, "is_causal", owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        n = x.shape[1]
        attn_mask = check_attn_mask(attn_mask, x.shape[0], self.heads, n, n, x.device, owner)
        x = zero_padding(x, key_padding_mask)
        q, k, v = self._split_heads(x)
        dropout_p = self.dropout if self.training else 0.0
        if incontext_kernel.usable(q, key_padding_mask, attn_mask, dropout_p):
            # the route chosen wherever it runs (the module's docstring has the figures): the bias inside the
            # attention kernel, never an (L x L) tensor
            out = incontext_kernel.attend_incontext(q, k, v, self._gates(x, None), self._tables(x), causal)
            return self._merge_heads(out)
        bias = self._bias(x, key_padding_mask, causal)  # causal: the bias masks the later keys itself
        out = attend(q, k, v, key_padding_mask=key_padding_mask, bias=bias, dropout_p=dropout_p, attn_mask=attn_mask)
        return zero_padding(self._merge_heads(out), key_padding_mask)

    def step(self, x: torch.Tensor, state: InContextState | None = None,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, InContextState]:
        """Attend from the new tokens x (batch, new, dim) to the cached tokens and themselves.

        Args:
            x: the new tokens, (batch, new, dim), following those in `state`.
            state: the InContextState returned by the previous call, or None to start a sequence.
            key_padding_mask: (batch, new) bool, True for real tokens; padding (the left padding of a batch of
                prompts of different lengths) is remembered, never attended, and counts 0.

        Returns:
            The outputs for the new tokens (batch, new, dim), zero at padding, and the state after them.
        """
        owner = type(self).__name__
        if not self.causal:
            raise RuntimeError(f"{owner}.step needs causal=True: a bidirectional layer has no cache")
        check_tokens(x, self.dim, owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        x = zero_padding(x, key_padding_mask)
        q, k, v = self._split_heads(x)
        b, wide = x.shape[0], self._wide(x)
        cached = (b, self.heads, None, self.head_dim)
        check_state(state, InContextState, {"keys": cached, "values": cached}, k.dtype, k.device, owner)
        if state is not None:
            check_state(state, InContextState, {"starts": (b, self.heads, None), "total": (b, self.heads)},
                        wide, k.device, owner)
            check_counts(state, owner)
        gates = self._gates(x, key_padding_mask)
        total = gates.new_zeros(b, self.heads) if state is None else state.total
        ends = gates.cumsum(-1) + total[..., None]
        starts, mask = ends - gates, key_padding_mask
        if state is not None:
            k, v = torch.cat([state.keys, k], -2), torch.cat([state.values, v], -2)
            starts = torch.cat([state.starts, starts], -1)
            if state.mask is not None or mask is not None:
                old = state.mask if state.mask is not None else x.new_ones(b, state.keys.shape[-2], dtype=torch.bool)
                new = mask if mask is not None else x.new_ones(x.shape[:2], dtype=torch.bool)
                mask = torch.cat([old, new], 1)
        # queries sit at the end of the keys; `attend` masks the keys after a query, whatever their entries
        tables = self._tables(x)
        if native.usable(tables, (torch.float32,)):
            bias = native.incontext_bias(ends, starts, tables, True)
        else:
            bias = self._interpolate(tables, (ends[..., :, None] - starts[..., None, :]).clamp(min=0))
        out = attend(q, k, v, causal=x.shape[1] > 1, key_padding_mask=mask, bias=bias)
        state = InContextState(k, v, starts, ends[..., -1].clone() if x.shape[1] else total, mask)
        return zero_padding(self._merge_heads(out), key_padding_mask), state


def check_counts(state: InContextState, owner: str) -> None:
    """What check_state cannot say of an InContextState: its keys, values, starts and mask agree in length."""
    seen = state.keys.shape[-2]
    if state.values.shape != state.keys.shape or state.starts.shape[-1] != seen:
        raise ValueError(f"{owner} state.keys, state.values and state.starts must cover one number of tokens, got "
                         f"{tuple(state.keys.shape)}, {tuple(state.values.shape)} and {tuple(state.starts.shape)}")
    mask = state.mask
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                             or mask.shape != (state.keys.shape[0], seen) or mask.device != state.keys.device):
        got = f"{tuple(mask.shape)} {mask.dtype} on {mask.device}" if isinstance(mask, torch.Tensor) else repr(mask)
        raise ValueError(f"{owner} state.mask must be None or a bool tensor of shape "
                         f"{(state.keys.shape[0], seen)} on {state.keys.device}, got {got}")
