"""Long sequences through a causal scan (micro, elita) in blocks that carry the scan's state.

Both scans are linear in length, but a single pass over a 64k-token sequence makes every
temporary tens of megabytes: on the CPU those miss the cache and are page-faulted in
fresh, so time grew about twice as fast as length (t(64k) / t(4k) of 30-40 here).
Blocks of 4096 tokens, each continuing from the state of the one before (what `step`
does one token at a time), keep the temporaries cache-sized and the time close to linear
(bench/attention.py measures it); the result is the same sum in the same order within a block.
"""

from __future__ import annotations

import torch

BLOCK = 4096


def scan(step, x: torch.Tensor, key_padding_mask: torch.Tensor | None):
    """Run `step(block, state, mask) -> (out, state)` over BLOCK-token pieces of x, carrying
    the state from each to the next (None into the first); the outputs joined along length."""
    if x.shape[1] <= BLOCK:  # one piece (and a graph that torch.export can trace for lengths up to BLOCK)
        return step(x, None, key_padding_mask)[0]
    # split, not slicing: the backward of each slice would write a zero tensor the size of x
    blocks = x.split(BLOCK, 1)
    masks = [None] * len(blocks) if key_padding_mask is None else key_padding_mask.split(BLOCK, 1)
    outs, state = [], None
    for block, mask in zip(blocks, masks):
        out, state = step(block, state, mask)
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)
