"""Quiet attention: softmax_one (Evan Miller's "attention is off by one").

    softmax_one(x)_i = exp(x_i) / (1 + sum_j exp(x_j))

The quiet-attention write-up subtracts the row maximum m first and then adds 1,
which computes exp(x_i - m) / (1 + sum_j exp(x_j - m)) = exp(x_i) / (exp(m) + sum_j exp(x_j)):
a different function whose weights can never all vanish (for x = [10, 10] it gives 1/3
each instead of about 1/2). We keep the 1 exact. How softmax_one is computed (a compiled
kernel, or softmax times a sigmoid) is normalizers.py's to say: it lives there, below every
mechanism, and stays importable from here.
"""

from __future__ import annotations

from zoo.attention.normalizers import softmax_one as softmax_one
from zoo.attention.softmax import SoftmaxAttention


class QuietAttention(SoftmaxAttention):
    """Multi-head attention whose weights are softmax_one: a head may attend to nothing.

    For each head h, with q, k, v the head's slices of W_qkv x and d = dim / heads:

        head_h = softmax_one(q k^T / sqrt(d) + B_h) v,    softmax_one(s)_j = exp(s_j) / (1 + sum_j' exp(s_j'))

    It runs through the fused SDPA kernels unchanged: a prepended key of zeros with a value of zeros adds
    exactly the 1 to every denominator (dot_product.py). Same inputs, outputs and KVCache decoding as
    SoftmaxAttention.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1); each head is dim / heads wide.
        causal: True: token i attends to tokens 0..i only, and `step` decodes; default False (bidirectional).
        bias: whether the qkv and output projections have biases (default True).
        dropout: the dropout probability on the attention weights while training, in [0, 1) (default 0).
        max_len: the longest sequence the learned bias covers, an int >= 1; needed with `learned_bias`,
            otherwise unused (default None).
        learned_bias: add a trainable bias per head over (query, key) positions, (heads, max_len, max_len),
            started at zero; default False.
        positions: None (default), "rope" or "alibi", as for SoftmaxAttention; the zero key keeps logit 0.
        rope_base: RoPE's frequency base, a finite number > 1 (default 10000).
        alibi_bias_max: the exponent of ALiBi's slowest slope (default 8), as for SoftmaxAttention.
    """

    quiet = True
