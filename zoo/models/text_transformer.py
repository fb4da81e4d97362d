"""TextTransformer: a decoder-only language model whose attention is swappable by name.

Token embedding, a position embedding that is learned, sinusoidal or absent (micro
and elita carry order in their running sums and need none), causal blocks, and an
output layer tied to the embedding. `generate` decodes with each block's recurrent
state: a KV cache for softmax and quiet, a constant-size state for micro and elita.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import KV_CACHED
from zoo.models.arguments import integer, number, transformer_sizes
from zoo.models.layers import POSITIONS, Block, check_choice, sincos_encoding
from zoo.registry import register
from zoo.release import Releasable
from zoo.tokenizer import tokenizer_from_dict


class TextTransformer(Releasable, nn.Module):
    def __init__(
        self,
        vocab_size: int = 65,
        context_length: int = 256,
        embed_dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        attention: str = "softmax",
        mlp: str = "mlp",
        pos_embed: str = "learned",
        drop_rate: float = 0.0,
        tokenizer: dict | None = None,
    ):
        super().__init__()
        owner = type(self).__name__
        vocab_size = integer(vocab_size, "vocab_size", owner)
        context_length = integer(context_length, "context_length", owner)
        embed_dim, depth, num_heads, mlp_ratio, drop_rate = transformer_sizes(
            owner, embed_dim, depth, num_heads, mlp_ratio, drop_rate)
        if tokenizer is not None and not isinstance(tokenizer, dict):
            raise TypeError(f"{owner} tokenizer must be a dict (a tokenizer's to_dict()) or None, got {tokenizer!r}")
        check_choice(attention, (*KV_CACHED, "micro", "elita"), "attention", owner)
        check_choice(pos_embed, POSITIONS, "pos_embed", owner)
        self.tokenizer = tokenizer_from_dict(tokenizer) if tokenizer else None
        if self.tokenizer is not None and self.tokenizer.vocab_size != vocab_size:
            raise ValueError(f"{owner} vocab_size={vocab_size}, but its tokenizer has {self.tokenizer.vocab_size}")
        self.config = dict(
            vocab_size=vocab_size, context_length=context_length, embed_dim=embed_dim, depth=depth,
            num_heads=num_heads, mlp_ratio=mlp_ratio, attention=attention, mlp=mlp, pos_embed=pos_embed,
            drop_rate=drop_rate, tokenizer=tokenizer,
        )
        self.vocab_size, self.context_length, self.pos_kind = vocab_size, context_length, pos_embed
        self.tok_embed = nn.Embedding(vocab_size, embed_dim)
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(context_length, embed_dim) * 0.02)
        else:
            self.pos_embed = None
        self.drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList([
            Block(embed_dim, num_heads, attention, causal=True, mlp=mlp, mlp_ratio=mlp_ratio,
                  max_len=context_length, dropout=drop_rate)
            for _ in range(depth)
        ])
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size, bias=False)
        self.head.weight = self.tok_embed.weight  # tied
        nn.init.normal_(self.tok_embed.weight, std=0.02)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "tok_embed.weight"}

    def _embed(self, idx: torch.Tensor, start: int | torch.Tensor) -> torch.Tensor:
        """Token and position embeddings of idx (batch, length) at positions start, start + 1, ...; `start`
        may be a 0-d integer tensor, as in the exported decoding step (zoo/models/decoding.py)."""
        if idx.dim() != 2 or idx.is_floating_point():
            raise ValueError(f"{type(self).__name__} expects integer token ids of shape (batch, length), "
                             f"got {tuple(idx.shape)} {idx.dtype}")
        stop = start + idx.shape[1]
        if torch.compiler.is_compiling():  # a compiled or exported graph checks the ids when it runs
            torch._assert_async(((idx >= 0) & (idx < self.vocab_size)).all(),
                                f"token ids must lie in [0, {self.vocab_size})")
            if self.pos_kind == "learned":
                message = f"{type(self).__name__} has learned positions for {self.context_length} tokens"
                if isinstance(stop, torch.Tensor):
                    torch._assert_async(stop <= self.context_length, message)
                else:  # a symbolic length
                    torch._check(stop <= self.context_length, lambda: message)
        else:
            if self.pos_kind == "learned" and stop > self.context_length:
                raise ValueError(f"{type(self).__name__} has learned positions for {self.context_length} tokens, "
                                 f"got {int(stop)}")
            if idx.numel() and (idx.min() < 0 or idx.max() >= self.vocab_size):
                raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got [{idx.min()}, {idx.max()}]")
        x = self.tok_embed(idx)
        if self.pos_kind == "learned":
            x = x + (self.pos_embed[start:stop] if isinstance(start, int) else
                     self.pos_embed[torch.arange(idx.shape[1], device=idx.device) + start])
        elif self.pos_kind == "sincos":
            x = x + sincos_encoding(idx.shape[1], x.shape[-1], start).to(x)
        return self.drop(x)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Next-token logits (batch, length, vocab) for token ids (batch, length)."""
        x = self._embed(idx, 0)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def forward_step(self, idx: torch.Tensor, states: list | None = None, start: int | torch.Tensor = 0):
        """Logits for new tokens given every block's state; returns (logits, states)."""
        if states is not None and (not isinstance(states, (list, tuple)) or len(states) != len(self.blocks)):
            got = f"{len(states)} states" if isinstance(states, (list, tuple)) else type(states).__name__
            raise ValueError(f"{type(self).__name__}.forward_step expects None or the list of {len(self.blocks)} "
                             f"block states it returned, got {got}")
        if not isinstance(start, torch.Tensor):  # a tensor position is the exported step's (decoding.py)
            integer(start, "forward_step start", type(self).__name__, 0)
        x = self._embed(idx, start)
        states = states or [None] * len(self.blocks)
        new_states = []
        for block, state in zip(self.blocks, states):
            x, state = block.step(x, state)
            new_states.append(state)
        return self.head(self.norm(x)), new_states

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor | list[int] | str,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> torch.Tensor | str:
        """Sample continuations. A string prompt (with a tokenizer) returns a string; ids return ids."""
        check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
        as_text = isinstance(tokens, str)
        if as_text:
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a model with a tokenizer; pass token ids instead")
            tokens = self.tokenizer.encode(tokens)
        idx = torch.as_tensor(tokens, dtype=torch.long, device=self.head.weight.device)
        if idx.dim() == 1:
            idx = idx[None]
        if idx.shape[1] == 0:
            raise ValueError("generate needs a prompt of at least one token")
        generator = torch.Generator(device=idx.device).manual_seed(seed) if seed is not None else None
        # Learned positions end at context_length: past it, the window slides and the last
        # context_length tokens are recomputed each step (as nanoGPT does); the others stream on.
        window = self.context_length if self.pos_kind == "learned" else None
        logits, states = self.forward_step(idx[:, -window:] if window else idx)
        logits, out = logits[:, -1], [idx]
        position = min(idx.shape[1], window or idx.shape[1])
        for _ in range(max_new_tokens):
            nxt = sample(logits, temperature, top_k, top_p, generator)
            out.append(nxt)
            if window and position >= window:
                logits, states = self.forward_step(torch.cat(out, dim=1)[:, -window:])
            else:
                logits, states = self.forward_step(nxt, states, position)
                position += 1
            logits = logits[:, -1]
        result = torch.cat(out, dim=1)
        return self.tokenizer.decode(result[0].tolist()) if as_text else result


MAX_NEW_TOKENS = 1_000_000


def check_sampling(max_new_tokens, temperature, top_k, top_p, seed) -> None:
    """Refuse sampling parameters outside their ranges before any token is generated."""
    owner = "generate"
    integer(max_new_tokens, "max_new_tokens", owner, 0, MAX_NEW_TOKENS)
    number(temperature, "temperature (0 = greedy)", owner)
    if top_k is not None:
        integer(top_k, "top_k", owner, 1)
    if top_p is not None:
        number(top_p, "top_p", owner, include_minimum=False, maximum=1.0)
    if seed is not None:
        integer(seed, "seed", owner, 0, 2**64 - 1)


def sample(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
           generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from (batch, vocab) logits: greedy at temperature 0, else top-k / nucleus sampling."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token once the tokens before it already cover top_p; the most likely always stays
        drop = cumulative - sorted_logits.softmax(-1) >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(F.softmax(logits, -1), 1, generator=generator)


# nanoGPT's CPU recipe size: 4 layers, 4 heads, width 128, context 64 (about 0.8M parameters)
TINY = dict(context_length=256, embed_dim=128, depth=4, num_heads=4)
SMALL = dict(context_length=256, embed_dim=384, depth=6, num_heads=6)
for attention, prefix, pos in (("softmax", "gpt", "learned"), ("quiet", "quiet-gpt", "learned"),
                               ("micro", "micro-gpt", "none"), ("elita", "elita-gpt", "none")):
    for size, dims in (("tiny", TINY), ("small", SMALL)):
        mlp = "ffn2" if attention == "elita" else "mlp"
        register(f"{prefix}-{size}", "text", TextTransformer, attention=attention, pos_embed=pos, mlp=mlp, **dims)
for attention in ("clipped", "gated"):  # the controls of Bondarenko et al. 2023 for the outlier study
    register(f"{attention}-gpt-tiny", "text", TextTransformer, attention=attention, pos_embed="learned", **TINY)
