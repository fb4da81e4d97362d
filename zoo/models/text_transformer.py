"""TextTransformer: a decoder-only language model whose attention is swappable by name.

Token embedding, a position embedding that is learned, sinusoidal or absent (micro
and elita carry order in their running sums and need none), causal blocks, and an
output layer tied to the embedding. Each block may have its own attention (a hybrid:
linear-time blocks with a few softmax ones). `generate` decodes with each block's
recurrent state: a KV cache for the softmax family and incontext, a constant-size
state for micro and elita.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zoo.attention import KV_CACHED
from zoo.models.arguments import flag, integer, number, transformer_sizes
from zoo.models.layers import (
    MLPS,
    POSITIONS,
    Block,
    check_choice,
    checked_block_options,
    per_block,
    sincos_encoding,
)
from zoo.models.pretrained import Releasable
from zoo.models.registry import register
from zoo.models.short_conv import MAX_WIDTH
from zoo.models.tokenizer import tokenizer_from_dict
from zoo.utils.checks import check_data, check_padding_mask, shown

# The causal mechanisms a block may have; after the softmax family the rest carry order themselves (running
# sums, ELiTA's positions, in-context positions, decaying memories), the softmax family (KV_CACHED, window among
# them) through its causal mask (and rope or alibi where its attention_options ask for them).
CAUSAL = (*KV_CACHED, "micro", "elita", "incontext", "gla", "deltanet", "ssd")
# Positions that the softmax family's blocks apply to queries and keys (zoo/attention/positions.py) rather than
# an embedding added at the input: relative, so they reach any length.
ROTARY_OR_ALIBI = ("rope", "alibi")


class TextTransformer(Releasable, nn.Module):
    """A decoder-only language model whose attention is chosen by name.

    Token ids (batch, length) are embedded, given positions, passed through `depth` causal pre-norm blocks
    and a final LayerNorm, and read out by an output layer tied to the token embedding: `forward` gives the
    next-token logits (batch, length, vocab_size). `generate` samples continuations, decoding with each
    block's recurrent state (a KV cache for the softmax family, keys, values and gate sums for incontext, a
    constant-size state for micro and elita).

    Each block may have its own attention and MLP (a hybrid, e.g. attention=["micro", "micro", "softmax",
    "micro"]: linear time in most blocks, exact recall in one), and its mechanism's own options.

    Positions: the position embedding (pos_embed) is added once, to the token embeddings at the input, whatever
    the blocks are; it is never dropped. micro, elita and incontext blocks carry order themselves (running sums,
    ELiTA's positions, in-context positions), so hybrids of them and their registered models use
    pos_embed="none". A block of the softmax family sees order only through its causal mask, unless its
    attention_options give it positions of its own ({"positions": "rope"} or "alibi", where its mechanism
    takes them). zoo refuses no combination: as before hybrids, a softmax model with pos_embed="none" is
    allowed (a causal mask lets it infer positions, Kazemnejad et al. 2023).

    Args:
        vocab_size: the number of token ids, an int >= 1 (default 65, Shakespeare's characters); must equal
            the tokenizer's.
        context_length: the longest sequence, an int >= 1 (default 256): with pos_embed="learned" the number
            of learned positions (`generate` then slides a window of this many tokens); n in ELiTA's
            positions in elita blocks (their max_len); otherwise no limit.
        embed_dim: the token width, an int >= 1 divisible by `num_heads` (default 128).
        depth: the number of transformer blocks, an int >= 0 (default 4).
        num_heads: the attention heads per block, an int >= 1 (default 4).
        mlp_ratio: the MLP's hidden width as a multiple of embed_dim, a number in (0, 1024] giving at least one
            hidden unit (default 4); unused with mlp="ffn2".
        attention: the blocks' causal attention: "softmax" (default), "quiet", "clipped", "gated", "micro",
            "elita", "incontext", "window", "gla", "deltanet" or "ssd" (see zoo.attention); or a list of `depth`
            such names, one per block.
        mlp: the blocks' feed-forward: "mlp" (default; Linear, GELU, Linear) or "ffn2" (ELiTA's FeedForward2);
            or a list of `depth` such names, one per block.
        pos_embed: the position encoding: "learned" (default), "sincos" (fixed sine-cosine, any length) or
            "none" (micro, elita and incontext blocks carry order themselves), added once at the input; or
            "rope" (rotary, Su et al. 2021) or "alibi" (Press et al. 2022), applied to the queries and keys of
            every softmax-family block (nothing is added at the input; relative, so any length).
        drop_rate: the dropout probability, in [0, 1), on the embeddings, the MLPs and the attention weights of
            the softmax family and incontext (default 0).
        tokenizer: the tokenizer as its `to_dict()`, carried in the config so that `generate` takes and returns
            text; default None (token ids only).
        attention_options: the mechanisms' own arguments (micro's num_queries, elita's max_len and pos_dim,
            clipped's alpha, incontext's num_positions, dropout, ...): one dict for every block, or a list of
            `depth` dicts (or None), one per block; JSON values. An option the block's mechanism does not take
            is refused naming the block. Default None: the mechanisms' defaults (with max_len = context_length
            for elita and the softmax family, dropout = drop_rate for the softmax family and incontext).
        tie_embeddings: the output layer shares the token embedding's weights (default True, as GPT-2 and the
            shipped models); False gives it weights of its own.
        embed_std: the standard deviation of the token embedding's initial weights, a number in (0, 100]
            (default 0.02, GPT-2's). At width 64, recall (MQAR) forms within 1,000 steps with
            tie_embeddings=False and embed_std=1.0 (PyTorch's own defaults) and took about 8,000 with the
            defaults: the small embeddings are drowned in the residual stream (bench/capabilities.py).
        short_conv: the width w of a causal convolution at the start of each block, over the token and the
            w - 1 before it (Based's local mixing, zoo/models/short_conv.py): an int in [2, 64], or 0 for none
            (default); or a list of `depth` such ints, one per block. It gives linear-time blocks the exact
            previous tokens that recall needs (a hybrid with it recalls where one without it does not,
            bench/capabilities.py); decoding keeps its last w - 1 inputs per block.
    """

    def __init__(
        self,
        vocab_size: int = 65,
        context_length: int = 256,
        embed_dim: int = 128,
        depth: int = 4,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        attention: str | list[str] = "softmax",
        mlp: str | list[str] = "mlp",
        pos_embed: str = "learned",
        drop_rate: float = 0.0,
        tokenizer: dict | None = None,
        attention_options: dict | list[dict | None] | None = None,
        tie_embeddings: bool = True,
        embed_std: float = 0.02,
        short_conv: int | list[int] = 0,
    ):
        super().__init__()
        owner = type(self).__name__
        vocab_size = integer(vocab_size, "vocab_size", owner)
        context_length = integer(context_length, "context_length", owner)
        embed_dim, depth, num_heads, mlp_ratio, drop_rate = transformer_sizes(
            owner, embed_dim, depth, num_heads, mlp_ratio, drop_rate)
        if tokenizer is not None and not isinstance(tokenizer, dict):
            raise TypeError(f"{owner} tokenizer must be a dict (a tokenizer's to_dict()) or None, got {tokenizer!r}")
        attentions = per_block(attention, depth, CAUSAL, "attention", owner)
        mlps = per_block(mlp, depth, MLPS, "mlp", owner)
        options = checked_block_options(attention_options, attentions, owner)
        check_choice(pos_embed, (*POSITIONS, *ROTARY_OR_ALIBI), "pos_embed", owner)
        named = [attention] if isinstance(attention, str) else attentions  # depth 0 counts the parameters
        if pos_embed in ROTARY_OR_ALIBI and not any(name in KV_CACHED for name in named):
            raise ValueError(f"{owner} pos_embed={pos_embed!r} acts inside the softmax family's blocks "
                             f"({', '.join(KV_CACHED)}), and this model has none: {named}; use 'none', "
                             "'learned' or 'sincos'")
        self.tokenizer = tokenizer_from_dict(tokenizer) if tokenizer else None
        if self.tokenizer is not None and self.tokenizer.vocab_size != vocab_size:
            raise ValueError(f"{owner} vocab_size={vocab_size}, but its tokenizer has {self.tokenizer.vocab_size}")
        # one name stays a string, a list a list (JSON gives lists back); attention_options is kept only when
        # given, so that a single-mechanism model's config is what it always was
        self.config = dict(
            vocab_size=vocab_size, context_length=context_length, embed_dim=embed_dim, depth=depth,
            num_heads=num_heads, mlp_ratio=mlp_ratio, attention=_as_given(attention), mlp=_as_given(mlp),
            pos_embed=pos_embed, drop_rate=drop_rate, tokenizer=tokenizer,
        )
        if attention_options is not None:
            self.config["attention_options"] = _as_given(attention_options)
        self.short_convs = _short_convs(short_conv, depth, owner)
        if any(self.short_convs):
            self.config["short_conv"] = _as_given(short_conv)
        tie_embeddings = flag(tie_embeddings, "tie_embeddings", owner)
        embed_std = number(embed_std, "embed_std", owner, include_minimum=False, maximum=100.0)
        for name, value, default in (("tie_embeddings", tie_embeddings, True), ("embed_std", embed_std, 0.02)):
            if value != default:  # likewise kept only where they differ from the defaults the shipped models had
                self.config[name] = value
        self.attentions = attentions  # one name per block
        self.vocab_size, self.context_length, self.pos_kind = vocab_size, context_length, pos_embed
        self.tok_embed = nn.Embedding(vocab_size, embed_dim)
        if pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.randn(context_length, embed_dim) * 0.02)
        else:
            self.pos_embed = None
        self.drop = nn.Dropout(drop_rate)
        self.blocks = nn.ModuleList()
        for index, (name, block_mlp, given, width) in enumerate(zip(attentions, mlps, options, self.short_convs)):
            if pos_embed in ROTARY_OR_ALIBI and name in KV_CACHED:  # positions inside the softmax family's blocks
                given = {"positions": pos_embed, **given}
            try:  # an option's value the mechanism refuses (num_queries=0): say which block
                self.blocks.append(Block(embed_dim, num_heads, name, causal=True, mlp=block_mlp, mlp_ratio=mlp_ratio,
                                         max_len=context_length, dropout=drop_rate, attention_options=given,
                                         short_conv=width))
            except (TypeError, ValueError) as e:
                raise type(e)(f"{owner} block {index} ({name}): {e}") from None
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size, bias=False)
        if tie_embeddings:
            self.head.weight = self.tok_embed.weight
        nn.init.normal_(self.tok_embed.weight, std=embed_std)

    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "tok_embed.weight"}

    grad_checkpointing = False

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them (timm's switch)."""
        self.grad_checkpointing = flag(enable, "set_grad_checkpointing enable", type(self).__name__)

    def group_matcher(self, coarse: bool = False) -> dict:
        """timm's parameter groups: the embeddings (tied to the output layer), each block, the final norm."""
        return {"stem": r"^tok_embed|^pos_embed",
                "blocks": r"^blocks\.(\d+)" if coarse else [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]}

    def _embed(self, idx: torch.Tensor, start: int | torch.Tensor,
               key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Token and position embeddings of idx (batch, length) at positions start, start + 1, ...; `start` is an
        int, a 0-d integer tensor (the exported decoding step, zoo/models/decoding.py) or one per row (batch, 1).
        With key_padding_mask, positions count from each row's first real token (the padding before it, never
        attended, gets position 0)."""
        owner = type(self).__name__
        if idx.dim() != 2 or idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
            raise ValueError(f"{owner} expects integer token ids of shape (batch, length), "
                             f"got {tuple(idx.shape)} {idx.dtype}")
        if key_padding_mask is not None:
            start = start - key_padding_mask.long().argmax(1, keepdim=True)  # (batch, 1)
        stop = start + idx.shape[1]
        # The values can be read only on the host: elsewhere (CUDA, a compiled graph) they are checked where the
        # kernels run, so that neither a forward pass nor a decoding step waits for the device.
        on_host = idx.device.type == "cpu" and not torch.compiler.is_compiling()
        if on_host and idx.numel() and (idx.min() < 0 or idx.max() >= self.vocab_size):
            raise ValueError(f"{owner} token ids must lie in [0, {self.vocab_size}), got [{idx.min()}, {idx.max()}]")
        if not on_host:
            torch._assert_async(((idx >= 0) & (idx < self.vocab_size)).all(),
                                f"token ids must lie in [0, {self.vocab_size})")
        if self.pos_kind == "learned":
            message = f"{owner} has learned positions for {self.context_length} tokens"
            if not isinstance(stop, torch.Tensor):
                if torch.compiler.is_compiling():  # a symbolic length
                    torch._check(stop <= self.context_length, lambda: message)
                elif stop > self.context_length:
                    raise ValueError(f"{message}, got {stop}")
            elif on_host:
                if int(stop.max()) > self.context_length:
                    raise ValueError(f"{message}, got {int(stop.max())}")
            else:
                torch._assert_async((stop <= self.context_length).all(), message)
        x = self.tok_embed(idx)
        if self.pos_kind == "learned":
            x = x + (self.pos_embed[start:stop] if isinstance(start, int) else
                     self.pos_embed[(torch.arange(idx.shape[1], device=idx.device) + start).clamp(min=0)])
        elif self.pos_kind == "sincos":
            x = x + sincos_encoding(idx.shape[1], x.shape[-1], start).to(x)
        return self.drop(x)

    def forward(self, idx: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token logits (batch, length, vocab) for token ids (batch, length).

        Args:
            idx: token ids, (batch, length), each in [0, vocab_size) (padding too).
            key_padding_mask: (batch, length) bool, True for real tokens (zoo's convention); padding is never
                attended, and positions count from each row's first real token, so a left-padded row gives the
                logits it gives alone. Default None: every token is real.
        """
        mask = check_padding_mask(key_padding_mask, idx, type(self).__name__)
        x = self._embed(idx, 0, mask)
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, mask, use_reentrant=False)
            else:
                x = block(x, key_padding_mask=mask)
        return self.head(self.norm(x))

    def forward_step(self, idx: torch.Tensor, states: list | None = None, start: int | torch.Tensor = 0,
                     key_padding_mask: torch.Tensor | None = None):
        """Logits for new tokens given every block's state; returns (logits, states).

        Args:
            idx: the new token ids, (batch, new).
            states: the list of block states the previous call returned, or None (default) to start.
            start: the position of idx's first token: an int >= 0, a 0-d integer tensor (an exported decoding
                step) or one per row, (batch, 1) (left-padded prompts); default 0.
            key_padding_mask: (batch, new) bool, True for real tokens: the left padding of prompts of different
                lengths, given with states=None; the states remember it. Positions then count from each row's
                first real token. Default None: all real.

        Returns:
            (tuple[torch.Tensor, list]): the logits (batch, new, vocab_size), and the blocks' states after the
                new tokens.
        """
        owner = type(self).__name__
        if states is not None and (not isinstance(states, (list, tuple)) or len(states) != len(self.blocks)):
            got = f"{len(states)} states" if isinstance(states, (list, tuple)) else type(states).__name__
            raise ValueError(f"{owner}.forward_step expects None or the list of {len(self.blocks)} "
                             f"block states it returned, got {got}")
        if not isinstance(start, torch.Tensor):
            integer(start, "forward_step start", owner, 0)
        elif start.shape not in ((), (idx.shape[0], 1)) or start.is_floating_point() or start.is_complex() \
                or start.dtype == torch.bool:
            raise ValueError(f"{owner}.forward_step start must be an int, a 0-d integer tensor or one per row "
                             f"({idx.shape[0]}, 1), got {tuple(start.shape)} {start.dtype}")
        mask = check_padding_mask(key_padding_mask, idx, owner)
        x = self._embed(idx, start, mask if states is None else None)
        states = states or [None] * len(self.blocks)
        new_states = []
        for block, state in zip(self.blocks, states):
            x, state = block.step(x, state, key_padding_mask=mask)
            new_states.append(state)
        return self.head(self.norm(x)), new_states

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor | list[int] | str | list[str] | list[list[int]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: int | str | list[int | str] | None = None,
    ) -> torch.Tensor | str | list:
        """Sample continuations of one prompt or of a batch of them.

        Args:
            tokens: the prompt: a string (needs the model's tokenizer), a list of token ids or an integer tensor,
                (length,) or (batch, length); or a batch of prompts of any lengths: a list of strings or a list
                of id lists. At least one token each, each id in [0, vocab_size). Prompts of different lengths
                are padded on the left and masked: each gives the tokens it gives alone (greedy).
            max_new_tokens: how many tokens to add at most, an int in [0, 1000000].
            temperature: the logits' divisor: 0 (greedy decoding) or a finite number >= 1e-4 (default 1).
            top_k: sample only from the k most likely tokens, an int >= 1; default None: all.
            top_p: nucleus sampling: only from the most likely tokens that together cover probability top_p,
                in (0, 1]; default None: all.
            seed: the random generator's seed, an int in [0, 2^64 - 1], for a repeatable sample; default None:
                torch's global generator.
            stop: a token id, a string (needs the tokenizer), or a list of them. A sequence ends at its first
                stop, which it keeps: the result ends with the stop token, or the text with the stop string
                (looked for in the generated text only). The others go on; decoding ends when all have stopped.
                Checking for stops reads each new token on the host; without stops nothing is read until the end.

        Returns:
            Each prompt and its continuation, in the prompt's form: a string for a string, a list for a list of
            prompts (of strings, or of id lists), else ids (batch, length + new), where a row that stopped
            before the others is filled with -1 after its stop.
        """
        check_sampling(max_new_tokens, temperature, top_k, top_p, seed)
        stop_ids, stop_texts = self._stops(stop)
        prompts, kind = self._prompts(tokens)
        if kind == "tensor":
            idx, mask = prompts, None
        else:
            longest = max(len(p) for p in prompts)
            idx = torch.zeros(len(prompts), longest, dtype=torch.long)
            mask = torch.zeros(len(prompts), longest, dtype=torch.bool)
            for row, prompt in enumerate(prompts):  # left padding: every row's next token goes in the last column
                idx[row, longest - len(prompt):], mask[row, longest - len(prompt):] = torch.tensor(prompt), True
            device = self.head.weight.device
            idx, mask = idx.to(device), (None if bool(mask.all()) else mask.to(device))
        generator = torch.Generator(device=idx.device).manual_seed(seed) if seed is not None else None
        # inference_mode, not only no_grad: it also skips autograd's version counting, which a decoding step of a
        # tiny model spends about 10% of its time on (bench/hybrid_decode.py); the result is concatenated outside
        # it, so that what a user gets back is an ordinary tensor (one they may train on or write into)
        with torch.inference_mode():
            # Learned positions end at context_length: past it, the window slides and the last
            # context_length tokens are recomputed each step (as nanoGPT does); the others stream on.
            window = self.context_length if self.pos_kind == "learned" else None
            prefill = slice(-window, None) if window else slice(None)
            logits, states = self.forward_step(idx[:, prefill],
                                               key_padding_mask=None if mask is None else mask[:, prefill])
            logits, out = logits[:, -1], [idx]
            if not bool(torch.isfinite(logits).all()):  # once, before the loop: sampling NaN fails or picks blindly
                raise ValueError(f"{type(self).__name__} produced non-finite logits (inf or NaN) for the prompt: "
                                 "its weights are likely too large (a diverged or damaged model)")
            column = min(idx.shape[1], window or idx.shape[1])  # tokens the states hold, padding included
            first = None if mask is None else mask[:, prefill].long().argmax(1, keepdim=True)  # each row's first real
            generated, ends = [[] for _ in range(idx.shape[0])], [None] * idx.shape[0]
            for _ in range(max_new_tokens):
                nxt = sample(logits, temperature, top_k, top_p, generator)
                out.append(nxt)
                if stop_ids or stop_texts:
                    self._note_stops(nxt[:, 0].tolist(), generated, ends, stop_ids, stop_texts)
                    if all(end is not None for end in ends):
                        break
                if window and column >= window:
                    recent = torch.cat(out, dim=1)[:, -window:]
                    recent_mask = None if mask is None else F.pad(mask, (0, len(out) - 1), value=True)[:, -window:]
                    logits, states = self.forward_step(recent, key_padding_mask=recent_mask)
                else:
                    logits, states = self.forward_step(nxt, states, column if first is None else column - first)
                    column += 1
                logits = logits[:, -1]
        return self._results(kind, prompts, torch.cat(out, dim=1), idx.shape[1], ends, stop_texts)

    def _stops(self, stop) -> tuple[set[int], list[str]]:
        """`stop` as token ids and strings, each checked: ids in [0, vocab_size), strings non-empty."""
        owner = f"{type(self).__name__}.generate"
        items = [] if stop is None else list(stop) if isinstance(stop, (list, tuple, set)) else [stop]
        ids, texts = set(), []
        for item in items:
            if isinstance(item, str) and item:
                if self.tokenizer is None:
                    raise ValueError(f"{owner} stop strings need a model with a tokenizer; pass token ids instead, "
                                     f"got {shown(item)}")
                texts.append(item)
            else:
                ids.add(integer(item, "stop (a token id or a non-empty string)", owner, 0, self.vocab_size - 1))
        return ids, texts

    def _note_stops(self, tokens: list[int], generated: list[list[int]], ends: list, stop_ids: set[int],
                    stop_texts: list[str]) -> None:
        """Record each unstopped row's new token, and where it stops (the count of its tokens, the stop included)."""
        for row, token in enumerate(tokens):
            if ends[row] is None:
                generated[row].append(token)
                if token in stop_ids or (stop_texts and any(s in self.tokenizer.decode(generated[row])
                                                            for s in stop_texts)):
                    ends[row] = len(generated[row])

    def _results(self, kind: str, prompts, result: torch.Tensor, width: int, ends: list, stop_texts: list[str]):
        """The prompts with their continuations, each cut after its stop, in the prompts' form."""
        if kind == "tensor":
            for row, end in enumerate(ends):
                if end is not None:
                    result[row, width + end:] = -1
            return result
        rows = []
        for row, prompt in enumerate(prompts):
            new = result[row, width:width + (ends[row] or result.shape[1])].tolist()
            if kind == "lists":
                rows.append(prompt + new)
                continue
            text = self.tokenizer.decode(prompt + new)
            if ends[row] is not None and stop_texts:  # the stop string may end inside the last token
                generated = self.tokenizer.decode(new)
                cut = min((generated.find(s) + len(s) for s in stop_texts if s in generated), default=len(generated))
                text = self.tokenizer.decode(prompt) + generated[:cut]
            rows.append(text)
        return rows[0] if kind == "text" else rows

    def _prompts(self, tokens) -> tuple[list[list[int]] | torch.Tensor, str]:
        """The prompts, as id lists, and their kind: "text", "texts", "lists", or a (batch, length) tensor."""
        owner = f"{type(self).__name__}.generate"
        texts = isinstance(tokens, str) or (
            isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, str) for t in tokens))
        if texts:
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a model with a tokenizer; pass token ids instead")
            many = not isinstance(tokens, str)
            prompts = [self._prompt(self.tokenizer.encode(t))[0].tolist() for t in (tokens if many else [tokens])]
            return prompts, "texts" if many else "text"
        if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, (list, tuple)) for t in tokens):
            return [self._prompt(t, f"prompt {i}", one=True)[0].tolist() for i, t in enumerate(tokens)], "lists"
        if isinstance(tokens, (list, tuple)) and any(isinstance(t, (str, list, tuple)) for t in tokens):
            raise TypeError(f"{owner} takes a string, a list of token ids or an integer tensor, or a list of "
                            f"prompts all strings or all id lists, got {shown(tokens)}")
        return self._prompt(tokens), "tensor"

    def _prompt(self, tokens, what: str = "a prompt", one: bool = False) -> torch.Tensor:
        """Token ids (a list or an integer tensor) as a (batch, length) int64 tensor on the model's device;
        never rounded (1.5 is refused, not read as 1). Their range is checked where they are embedded.
        one=True: `tokens` is one prompt of a batch, so only a flat list of ids."""
        owner = f"{type(self).__name__}.generate"
        if torch.is_tensor(tokens):
            idx = check_data(tokens, what, owner)
        else:
            try:
                idx = torch.as_tensor(tokens)
            except (TypeError, ValueError, RuntimeError) as e:  # strings, integers beyond int64
                raise TypeError(f"{owner} takes a string, a list of token ids or an integer tensor, got "
                                f"{shown(tokens)}: {str(e).splitlines()[0]}") from None
        if one and idx.dim() > 1:  # its rows would be read as more prompts, of which only the first was kept
            raise TypeError(f"{owner} takes a list of token ids, a list of lists of token ids (a batch), a string "
                            f"or a list of strings (with a tokenizer), or an integer tensor (length,) or (batch, "
                            f"length); {what} is nested too deep: {shown(tokens)}")
        if idx.dim() not in (1, 2):
            raise ValueError(f"{owner} takes token ids of shape (length,) or (batch, length), got {tuple(idx.shape)}")
        idx = idx if idx.dim() == 2 else idx[None]
        if 0 in idx.shape:
            raise ValueError(f"{owner} needs {what} of at least one token, got shape {tuple(idx.shape)}")
        if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
            raise TypeError(f"{owner} token ids must be integers, got {idx.dtype}")
        if idx.device.type == "cpu" and idx.numel() and (idx.min() < 0 or idx.max() >= self.vocab_size):
            raise ValueError(f"{owner} token ids must lie in [0, {self.vocab_size}), got "
                             f"[{int(idx.min())}, {int(idx.max())}] in {what}")
        return idx.to(device=self.head.weight.device, dtype=torch.long)


def _short_convs(value, depth: int, owner: str) -> list[int]:
    """short_conv for every block, from one width for all (checked even at depth 0) or a list of `depth`."""
    if not isinstance(value, (list, tuple)):
        return [_short_conv(value, "short_conv", owner)] * depth
    if len(value) != depth:
        raise ValueError(f"{owner} short_conv lists {len(value)} widths, but depth={depth}: give one per block, "
                         f"or one for all")
    return [_short_conv(width, f"short_conv[{i}] (block {i})", owner) for i, width in enumerate(value)]


def _short_conv(width, what: str, owner: str) -> int:
    """0 (none) or a width in [2, MAX_WIDTH]."""
    if integer(width, what, owner, 0, MAX_WIDTH) == 1:
        raise ValueError(f"{owner} {what} must be 0 (none) or a width between 2 and {MAX_WIDTH}, got 1: a "
                         f"convolution over one token sees no other")
    return int(width)


def _as_given(value):
    """A constructor argument as the config keeps it: tuples as lists, dicts copied, so that JSON gives it back."""
    if isinstance(value, (list, tuple)):
        return [_as_given(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_given(v) for k, v in value.items()}
    return value


MAX_NEW_TOKENS = 1_000_000
# Sampling divides float32 logits by the temperature: at 1e-38 a logit of 30 overflows to inf, below it every
# logit does, and softmax's NaN then crashed torch.multinomial. At 1e-4 logits up to 3e34 stay finite, and a
# smaller temperature would sample the greedy choice in all but near ties anyway (temperature=0 is that).
MIN_TEMPERATURE = 1e-4


def check_sampling(max_new_tokens, temperature, top_k, top_p, seed) -> None:
    """Refuse sampling parameters outside their ranges before any token is generated."""
    owner = "generate"
    integer(max_new_tokens, "max_new_tokens", owner, 0, MAX_NEW_TOKENS)
    if 0 < number(temperature, "temperature (0 = greedy)", owner) < MIN_TEMPERATURE:
        raise ValueError(f"{owner} temperature must be 0 (greedy) or a finite number >= {MIN_TEMPERATURE}, got "
                         f"{shown(temperature)}: the logits divided by less can overflow to inf")
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
# zoo.load("gpt-tiny") takes the tiny-shakespeare checkpoint; War and Peace's (context 2,048) by its tag
DEFAULT_TAG = "shakespeare"
for attention, prefix, pos in (("softmax", "gpt", "learned"), ("quiet", "quiet-gpt", "learned"),
                               ("micro", "micro-gpt", "none"), ("elita", "elita-gpt", "none")):
    for size, dims in (("tiny", TINY), ("small", SMALL)):
        mlp = "ffn2" if attention == "elita" else "mlp"
        register(f"{prefix}-{size}", "text", TextTransformer, default_tag=DEFAULT_TAG, attention=attention,
                 pos_embed=pos, mlp=mlp, **dims)
for attention in ("clipped", "gated"):  # the controls of Bondarenko et al. 2023 for the outlier study
    register(f"{attention}-gpt-tiny", "text", TextTransformer, attention=attention, pos_embed="learned", **TINY)
# Hybrids: linear-time blocks with one softmax block, which gives them exact recall (docs: "What each attention
# can do"). The softmax block comes last: placed after the linear blocks it reads what they have mixed, and the
# capability bench's placement study (bench/hybrid_placement.py) found recall higher there than first. Decoding
# time does not depend on the place.


def _hybrid(linear: str, depth: int = TINY["depth"]) -> list[str]:
    """`linear` in every block but the last, softmax there."""
    return ["softmax" if index == depth - 1 else linear for index in range(depth)]


register("hybrid-micro-gpt-tiny", "text", TextTransformer, default_tag=DEFAULT_TAG, attention=_hybrid("micro"),
         pos_embed="none", mlp="mlp", **TINY)
register("hybrid-elita-gpt-tiny", "text", TextTransformer, default_tag=DEFAULT_TAG, attention=_hybrid("elita"),
         pos_embed="none", mlp="ffn2", **TINY)
# The same hybrids with a short convolution (width 4) at the start of every block, Based's local mixing: it hands
# each value the key before it, which the softmax block then matches; recall is what it buys.
register("hybrid-micro-conv-gpt-tiny", "text", TextTransformer, default_tag=DEFAULT_TAG, attention=_hybrid("micro"),
         pos_embed="none", mlp="mlp", short_conv=4, **TINY)
register("hybrid-elita-conv-gpt-tiny", "text", TextTransformer, default_tag=DEFAULT_TAG, attention=_hybrid("elita"),
         pos_embed="none", mlp="ffn2", short_conv=4, **TINY)
# The ELiTA hybrid with its convolution in the first block only: the key reaches the value there once, and the
# softmax block reads it; a decoding step then pays for one convolution instead of four (bench/hybrid_decode.py).
register("hybrid-elita-conv1-gpt-tiny", "text", TextTransformer, default_tag=DEFAULT_TAG, attention=_hybrid("elita"),
         pos_embed="none", mlp="ffn2", short_conv=[4] + [0] * (TINY["depth"] - 1), **TINY)
register("incontext-gpt-tiny", "text", TextTransformer, attention="incontext", pos_embed="none", **TINY)
# The field's yardsticks (docs: "Choosing an attention"): sliding-window softmax attention with rotary positions
# (Mistral's form, a window of 64 tokens) and three linear-time layers with a matrix memory, each in every block.
register("window-gpt-tiny", "text", TextTransformer, attention="window", pos_embed="rope",
         attention_options={"window": 64}, **TINY)
for attention in ("gla", "deltanet", "ssd"):
    register(f"{attention}-gpt-tiny", "text", TextTransformer, attention=attention, pos_embed="none", **TINY)
# The mini study, at ten times the tiny size: width 256, 6 blocks, a context of 2,048, 4.0M (ELiTA) to 5.8M (SSD)
# parameters. Named "mini" because "small" is nanoGPT's width-384 size above, which the tiny-shakespeare leaderboard
# measured. Each family in the form the tiny study found best for long text: softmax with rotary positions (the
# fair baseline), ELiTA with ALiBi's fading history instead of its sines, the in-context bias, the ELiTA hybrid with
# one short convolution (its softmax block last) and the yardstick that led the tiny tables (SSD: the best
# tiny-shakespeare loss and MQAR recall of the four).
MINI = dict(context_length=2048, embed_dim=256, depth=6, num_heads=4)
MINI_TAG = "warpeace"  # each trains on War and Peace and on the standard library: the book is the default
register("gpt-mini", "text", TextTransformer, default_tag=MINI_TAG, attention="softmax", pos_embed="rope", **MINI)
register("elita-gpt-mini", "text", TextTransformer, default_tag=MINI_TAG, attention="elita", pos_embed="none",
         mlp="ffn2", attention_options={"pos_dim": 0, "positions": "alibi"}, **MINI)
register("incontext-gpt-mini", "text", TextTransformer, default_tag=MINI_TAG, attention="incontext",
         pos_embed="none", **MINI)
register("hybrid-elita-conv1-gpt-mini", "text", TextTransformer, default_tag=MINI_TAG,
         attention=_hybrid("elita", MINI["depth"]), pos_embed="none", mlp="ffn2",
         short_conv=[4] + [0] * (MINI["depth"] - 1), **MINI)
register("ssd-gpt-mini", "text", TextTransformer, default_tag=MINI_TAG, attention="ssd", pos_embed="none", **MINI)
