"""Slow, obvious float64 references written straight from the formulas.

Loops over tokens on purpose: nothing here shares code or tricks with zoo.attention.
Each takes the module under test only to read its parameters.
"""

from __future__ import annotations

import math

import torch


def softmax_one(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """exp(x_i) / (1 + sum_j exp(x_j)), as exp(x_i - log(exp(0) + sum_j exp(x_j))) so float64 holds |x| ~ 1e4."""
    x = x.double()
    zero = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.exp(x - torch.logsumexp(torch.cat([zero, x], dim), dim, keepdim=True))


def multi_head_attention(layer, x, key_padding_mask=None, quiet=False):
    """sciformer's multi-head attention, one (batch, head, query) at a time."""
    x = x.double()
    b, n, d = x.shape
    h, hd = layer.heads, layer.head_dim
    w, bias = layer.qkv.weight.double(), layer.qkv.bias
    qkv = x @ w.T + (bias.double() if bias is not None else 0)
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            sl = slice(hi * hd, (hi + 1) * hd)
            for i in range(n):
                keys = [j for j in range(n) if (not layer.causal or j <= i)]
                if key_padding_mask is not None:
                    keys = [j for j in keys if key_padding_mask[bi, j]]
                logits = torch.stack([q[bi, i, sl] @ k[bi, j, sl] / math.sqrt(hd) for j in keys]) if keys else None
                if logits is None:
                    continue
                if layer.attn_bias is not None:
                    logits = logits + layer.attn_bias[hi, i, keys].double()
                e = torch.exp(logits)
                weights = e / ((1 if quiet else 0) + e.sum())
                out[bi, i, sl] = sum(weights[t] * v[bi, j, sl] for t, j in enumerate(keys))
    ob = layer.proj.bias.double() if layer.proj.bias is not None else 0
    return out @ layer.proj.weight.double().T + ob


def micro_attention(layer, x, key_padding_mask=None):
    """x_i minus the score-weighted mean, term by term; with positions="alibi" each score s_j of row i times
    e^{-m (i - j)}, m = 2^(-8 (h + 1) / heads) (ALiBi's slopes for a power-of-two number of heads; the layer's
    alibi_bias_max in place of 8)."""
    x = x.double()
    b, n, d = x.shape
    h, hd, p = layer.heads, layer.head_dim, layer.num_queries
    queries = layer.queries.double().view(h, p, d)
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            sl = slice(hi * hd, (hi + 1) * hd)
            m = 2 ** (-layer.alibi_bias_max * (hi + 1) / h) if getattr(layer, "positions", None) == "alibi" else 0.0
            scores = [torch.relu(queries[hi] @ x[bi, j]).sum() for j in range(n)]
            if key_padding_mask is not None:
                scores = [s if key_padding_mask[bi, j] else s * 0 for j, s in enumerate(scores)]
            for i in range(n):
                seen = range(i + 1) if layer.causal else range(n)
                faded = {j: scores[j] * math.exp(-m * (i - j)) for j in seen}
                total = sum(faded.values())
                mean = sum(faded[j] * x[bi, j, sl] for j in seen) / total if total > 0 else 0
                out[bi, i, sl] = x[bi, i, sl] - mean
    return out @ layer.proj.weight.double().T


def elita_attention(layer, x):
    """Attention2's equation for y_i, term by term (plain exponentials: keep inputs moderate); with
    positions="alibi", each history term X_j of row i times e^{-m (i - j)}, m = 2^(-8 (h + 1) / heads) (ALiBi's
    slopes for a power-of-two number of heads; the layer's alibi_bias_max in place of 8)."""
    x = x.double()
    b, n, d = x.shape
    h, hd = layer.heads, layer.head_dim
    k1, k2, k3 = layer.keys.double()
    a, ph, c = layer.freq.double(), layer.phase.double(), layer.pos_weight.double()
    v_all = x @ layer.value.weight.double().T
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            sl = slice(hi * hd, (hi + 1) * hd)

            def p(r, i, hi=hi):
                return torch.sin(i * a[r, hi] / layer.max_len + ph[r, hi])

            m = 2 ** (-layer.alibi_bias_max * (hi + 1) / h) if getattr(layer, "positions", None) == "alibi" else 0.0
            big_x = [torch.exp(k1[hi] @ x[bi, j] + p(0, j) @ c[hi]) for j in range(n)]
            for i in range(n):
                own = torch.exp(k2[hi] @ x[bi, i])
                row = torch.exp(p(1, i) @ c[hi] + k3[hi] @ x[bi, i])
                faded = [big_x[j] * math.exp(-m * (i - j)) for j in range(i + 1)]
                num = own * v_all[bi, i, sl] + row * sum(faded[j] * v_all[bi, j, sl] for j in range(i + 1))
                den = own + row * sum(faded)
                out[bi, i, sl] = num / den
    return out


def elita_recurrent(layer, x):
    """Attention2 as a token-by-token recurrence with a running log-sum-exp: for long inputs."""
    x = x.double()
    b, n, d = x.shape
    h, hd = layer.heads, layer.head_dim
    k1, k2, k3 = layer.keys.double()
    a, ph, c = layer.freq.double(), layer.phase.double(), layer.pos_weight.double()
    v = (x @ layer.value.weight.double().T).view(b, n, h, hd)
    i = torch.arange(n, dtype=torch.float64)[:, None, None] / layer.max_len
    p1c = (torch.sin(i * a[0] + ph[0]) * c).sum(-1)  # (n, h)
    p2c = (torch.sin(i * a[1] + ph[1]) * c).sum(-1)
    hist = torch.einsum("bnd,hd->bnh", x, k1) + p1c
    own = torch.einsum("bnd,hd->bnh", x, k2)
    row = torch.einsum("bnd,hd->bnh", x, k3) + p2c
    log_z = torch.full((b, h), -math.inf, dtype=torch.float64)
    mean = torch.zeros(b, h, hd, dtype=torch.float64)  # sum_j X_j V x_j / sum_j X_j
    out = torch.empty(b, n, h, hd, dtype=torch.float64)
    for t in range(n):
        new_log_z = torch.logaddexp(log_z, hist[:, t])
        mean = torch.exp(log_z - new_log_z)[..., None] * mean + torch.exp(hist[:, t] - new_log_z)[..., None] * v[:, t]
        log_z = new_log_z
        # numerator and denominator both divided by e^{own} + e^{row + log_z}
        log_den = torch.logaddexp(own[:, t], row[:, t] + log_z)
        out[:, t] = (torch.exp(own[:, t] - log_den)[..., None] * v[:, t]
                     + torch.exp(row[:, t] + log_z - log_den)[..., None] * mean)
    return out.view(b, n, d)


def feed_forward2(layer, x):
    x = x.double()

    def swish(z):
        return z / (torch.exp(-z) + 1)

    h = swish(x @ layer.w1.weight.double().T + layer.w1.bias.double())
    g = swish(x @ layer.w2.weight.double().T + layer.w2.bias.double())
    kernel = layer.w3.weight.double().view(layer.dim, layer.dim, layer.rank)  # W3[k, i, j]
    return torch.einsum("...i,...j,kij->...k", h, g, kernel) + layer.w3.bias.double()


def fused_attention(layer, x, key_padding_mask=None, norm="softmax", fuse="mean"):
    """alpha = fuse(norm(K^T Q / sqrt(d))) with the L x L matrix spelled out, Y = V alpha."""
    x = x.double()
    b, n, d = x.shape
    h, hd = layer.heads, layer.head_dim

    def lin(m, t):
        return t @ m.weight.double().T + (m.bias.double() if m.bias is not None else 0)

    q, k, v = lin(layer.f_q, x), lin(layer.f_k, x), lin(layer.f_v, x)
    out = torch.zeros(b, d, dtype=torch.float64)
    alphas = torch.zeros(b, h, n, dtype=torch.float64)
    for bi in range(b):
        real = [j for j in range(n) if key_padding_mask is None or key_padding_mask[bi, j]]
        for hi in range(h):
            sl = slice(hi * hd, (hi + 1) * hd)
            scores = torch.zeros(n, n, dtype=torch.float64)  # (key, query), as K^T Q
            for kj in real:
                for qi in real:
                    scores[kj, qi] = k[bi, kj, sl] @ q[bi, qi, sl] / math.sqrt(hd)
            cols = []
            for qi in real:
                e = torch.zeros(n, dtype=torch.float64)
                e[real] = torch.exp(scores[real, qi])
                cols.append(e / ((1 if norm == "softmax_one" else 0) + e.sum()))
            cols = torch.stack(cols, dim=1)  # (keys, real queries)
            alpha = cols.mean(1) if fuse == "mean" else cols.max(1).values
            alphas[bi, hi] = alpha
            out[bi, sl] = sum(alpha[j] * v[bi, j, sl] for j in range(n))
    return out, alphas


def greedy_by_recompute(model, prompt: list[int], steps: int) -> list[int]:
    """Greedy decoding the slow way: each new token the argmax of a full forward pass over the sequence so far
    (no state, no cache), the reference for every decoding path."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def decayed_sum(q, k, v, log_decay, initial=None):
    """S_t = diag(a_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, one token at a time in float64; log_decay (B, H, L)
    (one a per head) or (B, H, L, dk) (one per key channel). Returns (o (B, H, L, dv), S after the last)."""
    q, k, v, log_decay = (t.double() for t in (q, k, v, log_decay))
    b, h, n, dk = k.shape
    state = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64) if initial is None else initial.double()
    out = []
    for t in range(n):
        a = torch.exp(log_decay[:, :, t])
        a = a[..., None, None] if a.dim() == 2 else a[..., :, None]
        state = a * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        out.append((state * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, 2), state


def delta_rule(q, k, v, beta, log_decay=None, initial=None):
    """S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, o_t = S_t^T q_t, one token at a time in float64."""
    q, k, v, beta = (t.double() for t in (q, k, v, beta))
    b, h, n, dk = k.shape
    state = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64) if initial is None else initial.double()
    eye = torch.eye(dk, dtype=torch.float64)
    out = []
    for t in range(n):
        a = 1.0 if log_decay is None else torch.exp(log_decay[:, :, t].double())[..., None, None]
        kt, bt = k[:, :, t], beta[:, :, t][..., None, None]
        erase = eye - bt * kt[..., :, None] * kt[..., None, :]
        state = a * (erase @ state) + bt * kt[..., :, None] * v[:, :, t, None, :]
        out.append((state * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, 2), state


def _rms(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight.double()


def _silu(x):
    return x / (1 + torch.exp(-x))


def _conv(h, conv):
    """A causal depthwise convolution, output t = bias + sum_j weight[:, j] h_{t - (w - 1) + j}, zeros before."""
    if conv is None:
        return h
    w, out = conv.width, torch.zeros_like(h)
    for t in range(h.shape[1]):
        acc = conv.bias.double().clone().expand(h.shape[0], -1).clone()
        for j in range(w):
            s = t - (w - 1) + j
            if s >= 0:
                acc = acc + conv.weight[:, j].double() * h[:, s]
        out[:, t] = acc
    return _silu(out)


def _heads(t, heads):
    b, n, _ = t.shape
    return t.view(b, n, heads, -1).transpose(1, 2)


def gla_layer(layer, x):
    """GatedLinearAttention in float64, one token at a time: S_t = diag(a_t) S_{t-1} + k_t v_t^T."""
    x = x.double()
    b, n, _ = x.shape
    lin = lambda m, t: t @ m.weight.double().T + (0 if m.bias is None else m.bias.double())  # noqa: E731
    q = _heads(lin(layer.q, x), layer.heads) * (layer.key_dim // layer.heads) ** -0.5
    k, v = _heads(lin(layer.k, x), layer.heads), _heads(lin(layer.v, x), layer.heads)
    if layer.decay == "fixed":
        log_decay = torch.tensor([math.log(1 - 2.0 ** (-5 - h)) for h in range(layer.heads)],
                                 dtype=torch.float64)[None, :, None].expand(b, -1, n)
    else:
        logits = lin(layer.gate[1], lin(layer.gate[0], x))
        log_decay = _heads(torch.clamp(-torch.log1p(torch.exp(-logits)) / layer.gate_normalizer, min=-5.0),
                           layer.heads)
    o, _ = decayed_sum(q, k, v, log_decay)
    o = _rms(o, layer.norm.weight, layer.norm.eps).transpose(1, 2).reshape(b, n, -1)
    return lin(layer.proj, o * _silu(lin(layer.g, x)))


def deltanet_layer(layer, x):
    """DeltaNetAttention in float64, one token at a time: S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T."""
    x = x.double()
    b, n, d = x.shape
    lin = lambda m, t: t @ m.weight.double().T + (0 if m.bias is None else m.bias.double())  # noqa: E731
    h = lin(layer.qkv, x)
    h = _conv(h, layer.conv) if layer.conv is not None else _silu(h)
    q, k, v = (_heads(t, layer.heads) for t in h.split(d, -1))
    q = q / q.norm(dim=-1, keepdim=True) * layer.head_dim ** -0.5
    k = k / k.norm(dim=-1, keepdim=True)
    beta = (1 / (1 + torch.exp(-lin(layer.beta, x)))).transpose(1, 2)
    log_decay = None
    if layer.gated:
        rate = torch.log1p(torch.exp(lin(layer.decay, x) + layer.dt_bias.double()))
        log_decay = (-torch.exp(layer.A_log.double()) * rate).transpose(1, 2)
    o, _ = delta_rule(q, k, v, beta, log_decay)
    o = _rms(o, layer.norm.weight, layer.norm.eps).transpose(1, 2).reshape(b, n, -1)
    return lin(layer.proj, o * _silu(lin(layer.g, x)))


def ssd_layer(layer, x):
    """SSDAttention (Mamba-2) in float64, one token at a time: S_t = e^{-dt_t A} S_{t-1} + dt_t B_t x_t^T,
    y_t = S_t^T C_t + D x_t, out = W_o RMSNorm(y * swish(z))."""
    x = x.double()
    b, n, _ = x.shape
    inner, state, heads = layer.inner, layer.state_dim, layer.heads
    proj = x @ layer.in_proj.weight.double().T
    z, xbc, dt = proj[..., :inner], proj[..., inner:2 * inner + 2 * state], proj[..., 2 * inner + 2 * state:]
    xbc = _conv(xbc, layer.conv) if layer.conv is not None else _silu(xbc)
    u, B, C = xbc[..., :inner], xbc[..., inner:inner + state], xbc[..., inner + state:]
    dt = torch.log1p(torch.exp(dt + layer.dt_bias.double()))  # (b, n, heads)
    A = torch.exp(layer.A_log.double())
    u = u.view(b, n, heads, -1)
    S = torch.zeros(b, heads, state, u.shape[-1], dtype=torch.float64)
    ys = []
    for t in range(n):
        decay = torch.exp(-dt[:, t] * A)[..., None, None]
        S = decay * S + (dt[:, t, :, None, None] * B[:, t, None, :, None]) * u[:, t, :, None, :]
        y = (S * C[:, t, None, :, None]).sum(-2) + layer.D.double()[:, None] * u[:, t]
        ys.append(y.reshape(b, -1))
    y = torch.stack(ys, 1)
    y = _rms(y * _silu(z), layer.norm.weight, layer.norm.eps)
    return y @ layer.proj.weight.double().T


def window_attention(layer, x, key_padding_mask=None):
    """WindowAttention (causal, no positions) in float64: query i over the real keys i - W < j <= i."""
    x = x.double()
    b, n, d = x.shape
    h, hd = layer.heads, layer.head_dim
    qkv = x @ layer.qkv.weight.double().T + (0 if layer.qkv.bias is None else layer.qkv.bias.double())
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            sl = slice(hi * hd, (hi + 1) * hd)
            for i in range(n):
                keys = [j for j in range(max(0, i - layer.window + 1), i + 1)
                        if key_padding_mask is None or key_padding_mask[bi, j]]
                if not keys:
                    continue
                logits = torch.stack([q[bi, i, sl] @ k[bi, j, sl] / math.sqrt(hd) for j in keys])
                w = torch.softmax(logits, 0)
                out[bi, i, sl] = sum(wj * v[bi, j, sl] for wj, j in zip(w, keys))
    out = out @ layer.proj.weight.double().T + (0 if layer.proj.bias is None else layer.proj.bias.double())
    if key_padding_mask is not None:
        out = out * key_padding_mask[..., None]
    return out
