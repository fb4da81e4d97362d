"""What linear-time attention is known to lose, as tasks generated from a seed (no files, no download).

Each task gives (input ids, target ids) for a causal model, targets -100 except at the positions
scored (zoo.data.sequences.SequenceData has the splits; zoo.training.SequenceTask the loss and the
accuracy per test length). Every generator is written here from its published definition:

- `MQAR`, multi-query associative recall (Arora, Eyuboglu et al. 2023, "Zoology", their
  `multiquery_ar`): key-value pairs, then queries of those keys at positions drawn by a power law.
- `SelectiveCopying` (Gu and Dao 2023, "Mamba", section 3.1): data tokens scattered among noise
  tokens, reproduced in order at the markers that end the sequence.
- `InductionHeads` (Olsson et al. 2022): a random segment repeated after a prefix of noise; scored on the
  second copy.
- `ListOps` (Nangia and Bowman 2018, with Long Range Arena's grammar and lengths, Tay et al. 2021):
  nested MAX, MIN, MED and SUM_MOD over digits; the answer is one digit.
"""

from __future__ import annotations

import random

import torch

from zoo.data.sequences import IGNORE, MAX_LENGTH, SequenceData
from zoo.utils.checks import flag, integer, number


def noise_tokens(vocab_size: int, exclude: torch.Tensor, length: int, g: torch.Generator) -> torch.Tensor:
    """`length` tokens drawn uniformly from [0, vocab_size) without the tokens in `exclude`."""
    tokens = torch.randint(vocab_size - len(exclude), (length,), generator=g)
    for token in exclude.sort().values.tolist():  # shift past each excluded token, smallest first
        tokens += tokens >= token
    return tokens


def mqar_sequence(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, pairs: torch.Tensor,
                  noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The pairs k0 v0 k1 v1 ... first, then at each of `positions` the key of pair `pairs[i]`, elsewhere
    `noise`; the target at a query is its pair's value, what the model must answer on reading the key."""
    x, y = noise.clone(), torch.full_like(noise, IGNORE)
    x[0 : 2 * len(keys) : 2], x[1 : 2 * len(keys) : 2] = keys, values
    x[positions], y[positions] = keys[pairs], values[pairs]
    return x, y


class MQAR(SequenceData):
    """Multi-query associative recall as Zoology defines it (Arora et al. 2023, `multiquery_ar`): keys from
    [1, vocab_size // 2) and values from [vocab_size // 2, vocab_size), distinct within a sequence; the
    `num_pairs` pairs open the sequence; the queries sit on every second position after them, the i-th such
    slot drawn with weight i ** (power_a - 1) (Zoology's power law, power_a=0.01: most queries come soon;
    1 is uniform); every other position holds noise. Loss and accuracy on the answers only.

    One change closes a shortcut. Zoology queries every key exactly once, so a model that answers with a
    value not yet used reaches H(n) / n by elimination (34% for 8 pairs), without any recall. Here each
    query names a key drawn at random with replacement, so a used value tells nothing and chance is
    1 / num_pairs; `distinct_queries=True` gives Zoology's exact task. Noise never holds one of the
    sequence's keys, so every occurrence of a key after the pairs is a scored query.

    Args:
        vocab_size: tokens in all: keys from [1, vocab_size // 2), values from the rest (Zoology: 8192).
        sequence_length: the training length; it must hold the pairs and a query slot per query.
        num_pairs: key-value pairs per sequence (Zoology's grid: 4 to 64).
        num_queries: queries per sequence; num_pairs when None.
        power_a: the power law of the query slots, in (0, 1]; 1 is uniform (Zoology: 0.01).
        distinct_queries: query each key at most once, as Zoology does (opens the elimination shortcut).
        test_lengths: lengths to test at besides sequence_length (length generalization), e.g. 2x to 16x it.
        batch_size: sequences per training batch (test batches at longer lengths hold as many tokens).
        train_samples: training sequences per epoch, drawn anew each epoch from (seed, epoch, index).
        val_samples: sequences of the fixed validation set (at sequence_length).
        test_samples: sequences of the fixed test set at each test length.
        seed: the training stream's seed; the validation and test sets are the same for every seed.
        num_workers: DataLoader worker processes.
    """

    name = "MQAR"

    def __init__(self, vocab_size: int = 8192, sequence_length: int = 64, num_pairs: int = 4,
                 num_queries: int | None = None, power_a: float = 0.01, distinct_queries: bool = False,
                 test_lengths: list[int] | None = None, batch_size: int = 64, train_samples: int = 100_000,
                 val_samples: int = 500, test_samples: int = 1_000, seed: int = 0, num_workers: int = 0):
        owner = "MQAR"
        self.vocab_size = integer(vocab_size, "vocab_size", owner, 4)
        self.num_pairs = integer(num_pairs, "num_pairs", owner)
        self.num_queries = self.num_pairs if num_queries is None else integer(num_queries, "num_queries", owner)
        self.power_a = number(power_a, "power_a", owner, include_minimum=False, maximum=1.0)
        self.distinct_queries = flag(distinct_queries, "distinct_queries", owner)
        keys = self.vocab_size // 2 - 1
        if self.num_pairs > keys:
            raise ValueError(f"MQAR num_pairs={self.num_pairs} needs as many distinct keys, but vocab_size="
                             f"{self.vocab_size} holds {keys} (keys are [1, vocab_size // 2)): set num_pairs <= {keys} "
                             f"or vocab_size >= {2 * self.num_pairs + 2}")
        if self.distinct_queries and self.num_queries > self.num_pairs:
            raise ValueError(f"MQAR distinct_queries queries each key at most once: num_queries must be <= "
                             f"num_pairs={self.num_pairs}, got {self.num_queries}")
        super().__init__(sequence_length, test_lengths, batch_size, train_samples, val_samples, test_samples, seed,
                         num_workers)

    def arguments(self) -> dict:
        return {"vocab_size": self.vocab_size, "num_pairs": self.num_pairs, "num_queries": self.num_queries,
                "power_a": self.power_a, "distinct_queries": self.distinct_queries}

    def check_length(self, length: int, name: str) -> None:
        need = 2 * self.num_pairs + 2 * self.num_queries
        if length < need:
            raise ValueError(f"MQAR {name}={length} is too short for num_pairs={self.num_pairs} (2 tokens each) and "
                             f"num_queries={self.num_queries} (on every second position after the pairs): it must be "
                             f">= {need}")

    def example(self, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        n, half = self.num_pairs, self.vocab_size // 2
        keys = torch.randperm(half - 1, generator=g)[:n] + 1
        values = torch.randperm(self.vocab_size - half, generator=g)[:n] + half
        slots = (length - 2 * n) // 2
        weights = torch.arange(1, slots + 1, dtype=torch.float64) ** (self.power_a - 1)
        positions = 2 * n + 2 * torch.multinomial(weights, self.num_queries, replacement=False, generator=g)
        if self.distinct_queries:
            pairs = torch.randperm(n, generator=g)[: self.num_queries]
        else:
            pairs = torch.randint(n, (self.num_queries,), generator=g)
        noise = noise_tokens(self.vocab_size, keys, length, g)
        return mqar_sequence(keys, values, positions, pairs, noise)


def selective_copying_sequence(tokens: torch.Tensor, positions: torch.Tensor, length: int,
                               vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise (token 0) with `tokens` at `positions` (increasing), then one marker (vocab_size - 1) per token;
    the target at the i-th marker is the i-th token."""
    m = len(tokens)
    x, y = torch.zeros(length, dtype=torch.long), torch.full((length,), IGNORE, dtype=torch.long)
    x[positions] = tokens
    x[length - m :], y[length - m :] = vocab_size - 1, tokens
    return x, y


class SelectiveCopying(SequenceData):
    """Mamba's selective copying (Gu and Dao 2023, section 3.1 and appendix E.1): `num_tokens` data tokens,
    drawn uniformly from 1..vocab_size - 2, at random positions among noise tokens (0), then `num_tokens`
    markers (vocab_size - 1); at the i-th marker the model must give the i-th data token. Unlike plain
    copying, the gaps vary, so a fixed shift (a convolution) cannot solve it. Mamba's setting: vocabulary 16,
    16 tokens, length 4096. Accuracy on the copied tokens only.

    Args:
        vocab_size: tokens in all: noise 0, marker vocab_size - 1, data tokens between (Mamba: 16).
        sequence_length: the training length, markers included (Mamba: 4096).
        num_tokens: data tokens to copy (Mamba: 16).
        test_lengths: lengths to test at besides sequence_length (length generalization), e.g. 2x to 16x it.
        batch_size: sequences per training batch (test batches at longer lengths hold as many tokens).
        train_samples: training sequences per epoch, drawn anew each epoch from (seed, epoch, index).
        val_samples: sequences of the fixed validation set (at sequence_length).
        test_samples: sequences of the fixed test set at each test length.
        seed: the training stream's seed; the validation and test sets are the same for every seed.
        num_workers: DataLoader worker processes.
    """

    name = "selective copying"

    def __init__(self, vocab_size: int = 16, sequence_length: int = 4096, num_tokens: int = 16,
                 test_lengths: list[int] | None = None, batch_size: int = 32, train_samples: int = 50_000,
                 val_samples: int = 500, test_samples: int = 1_000, seed: int = 0, num_workers: int = 0):
        self.vocab_size = integer(vocab_size, "vocab_size (noise, marker and at least one data token)",
                                  "SelectiveCopying", 3)
        self.num_tokens = integer(num_tokens, "num_tokens", "SelectiveCopying")
        super().__init__(sequence_length, test_lengths, batch_size, train_samples, val_samples, test_samples, seed,
                         num_workers)

    def arguments(self) -> dict:
        return {"vocab_size": self.vocab_size, "num_tokens": self.num_tokens}

    def check_length(self, length: int, name: str) -> None:
        if length < 2 * self.num_tokens:
            raise ValueError(f"SelectiveCopying {name}={length} must hold num_tokens={self.num_tokens} data tokens "
                             f"and as many markers: it must be >= {2 * self.num_tokens}")

    def example(self, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        m = self.num_tokens
        tokens = torch.randint(1, self.vocab_size - 1, (m,), generator=g)
        positions = torch.randperm(length - m, generator=g)[:m].sort().values
        return selective_copying_sequence(tokens, positions, length, self.vocab_size)


def induction_sequence(tokens: torch.Tensor, prefix: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`prefix`, then `tokens` twice; from the second copy's first token on, the target is the next token
    of the copy (what followed the current token the first time)."""
    prefix = tokens[:0] if prefix is None else prefix
    start = len(prefix) + len(tokens)  # the second copy
    x = torch.cat([prefix, tokens, tokens])
    y = torch.full_like(x, IGNORE)
    y[start:-1] = x[start + 1 :]
    return x, y


class InductionHeads(SequenceData):
    """A random segment of distinct tokens, then the same segment again (Olsson et al. 2022): in the second
    copy each next token is the one that followed the current token the first time, which is what an
    induction head retrieves. Scored on the second copy from its first token on (predicting its second;
    the first cannot be known).

    One change closes a shortcut. With a segment of half the sequence every time, the answer always sits
    the same distance back (half the length, minus one), and a head that attends that far back solves the
    task without induction: rotary positions did (100% at the training length, 0% at twice it). Here the
    segment's length s is drawn per sequence from [length // 4, min(length // 2, vocab_size - 1)], after
    a prefix of length - 2 s noise tokens that are not in the segment, so the distance varies and every
    answer is still unambiguous.

    Args:
        vocab_size: tokens to draw from; more than a quarter of every length tested.
        sequence_length: the training length, at least 4.
        test_lengths: lengths to test at besides sequence_length (length generalization), e.g. 2x to 16x it.
        batch_size: sequences per training batch (test batches at longer lengths hold as many tokens).
        train_samples: training sequences per epoch, drawn anew each epoch from (seed, epoch, index).
        val_samples: sequences of the fixed validation set (at sequence_length).
        test_samples: sequences of the fixed test set at each test length.
        seed: the training stream's seed; the validation and test sets are the same for every seed.
        num_workers: DataLoader worker processes.
    """

    name = "induction heads"

    def __init__(self, vocab_size: int = 2048, sequence_length: int = 128, test_lengths: list[int] | None = None,
                 batch_size: int = 32, train_samples: int = 50_000, val_samples: int = 500, test_samples: int = 1_000,
                 seed: int = 0, num_workers: int = 0):
        self.vocab_size = integer(vocab_size, "vocab_size", "InductionHeads", 2)
        super().__init__(sequence_length, test_lengths, batch_size, train_samples, val_samples, test_samples, seed,
                         num_workers)

    def arguments(self) -> dict:
        return {"vocab_size": self.vocab_size}

    def check_length(self, length: int, name: str) -> None:
        if length < 4:
            raise ValueError(f"InductionHeads {name} must be >= 4 (a segment of 2 and its copy, one token scored), "
                             f"got {length}")
        shortest = self._shortest(length)
        if shortest > self.vocab_size - 1:
            raise ValueError(f"InductionHeads {name}={length} repeats segments of at least {shortest} distinct "
                             f"tokens beside noise from the other tokens, more than vocab_size={self.vocab_size} "
                             f"allows: set vocab_size >= {shortest + 1}")

    @staticmethod
    def _shortest(length: int) -> int:
        return max(2, length // 4)  # a quarter of the sequence, and at least one token scored

    def example(self, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        shortest, longest = self._shortest(length), min(length // 2, self.vocab_size - 1)
        size = int(torch.randint(shortest, longest + 1, (), generator=g))
        segment = torch.randperm(self.vocab_size, generator=g)[:size]
        return induction_sequence(segment, noise_tokens(self.vocab_size, segment, length - 2 * size, g))


LISTOPS_TOKENS = [str(d) for d in range(10)] + ["[MIN", "[MAX", "[MED", "[SM", "]", "<pad>"]
LISTOPS_IDS = {t: i for i, t in enumerate(LISTOPS_TOKENS)}
OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END, PAD = LISTOPS_IDS["]"], LISTOPS_IDS["<pad>"]
OPERATOR_P = 0.25  # LRA's VALUE_P: a node above max_depth is an operator with this probability
MAX_TRIES = 100_000
# the most tokens an average draw may hold. A tree is built whole before its length is checked, and a node has on
# average OPERATOR_P * (2 + max_args) / 2 children: above 1 the mean grows by that factor a level (7e18 tokens for
# max_args=1000 at depth 10, a draw that never ends). Measured at depth 10 and LRA's lengths: max_args=10 averages
# 132 tokens and 1 ms an expression; 20 averages 15,000 and 5 s an expression, nearly every draw thrown away.
MAX_MEAN_TOKENS = 2**16


def listops_mean_tokens(max_args: int, max_depth: int) -> float:
    """The expected tokens of one tree `ListOps.tree` draws: a digit, or with probability OPERATOR_P (above
    max_depth) an operator and "]" around 2..max_args subtrees, (2 + max_args) / 2 on average."""
    mean = 1.0
    for _ in range(max_depth - 1):
        mean = (1 - OPERATOR_P) + OPERATOR_P * (2 + (2 + max_args) / 2 * mean)
    return mean


def listops_apply(operator: str, args: list[int]) -> int:
    if operator == "[MIN":
        return min(args)
    if operator == "[MAX":
        return max(args)
    if operator == "[MED":  # as int(numpy.median): the mean of the two middle values, rounded down
        s = sorted(args)
        return (s[(len(s) - 1) // 2] + s[len(s) // 2]) // 2
    return sum(args) % 10  # [SM


class ListOps(SequenceData):
    """ListOps with Long Range Arena's grammar and lengths (Tay et al. 2021, lra_benchmarks/data/listops.py;
    the task of Nangia and Bowman 2018), from our own generator. A node above `max_depth` is, with
    probability 0.25, an operator (MIN, MAX, MED, SM = sum mod 10) over 2..max_args nodes, else a digit;
    the root is at depth 1. Trees are drawn until one is between `min_length` and `max_length` tokens (LRA:
    strictly between 500 and 2,000). Tokens: the digits 0-9 (ids 0-9), "[MIN" "[MAX" "[MED" "[SM", "]"
    and padding (ids 10-15); LRA's parentheses carry nothing and are left out.

    A classification of the whole expression: sequences are padded after the expression to `max_length`
    and a causal model is scored at the expression's last token ("]"), the first position that has read
    it whole; the answer is the digit's token id. max_args is 10 by default, as in LRA's generator: with 5,
    not one tree of more than 500 tokens came out in 20,000 draws here.

    Args:
        max_depth: the deepest a digit may sit, the root at 1 (LRA: 10).
        max_args: most arguments of one operator, at least 2 (LRA's generator: 10); at most max_length - 2 (an
            operator of more is longer than that), and at most what keeps an average draw within 2**16 tokens
            (MAX_MEAN_TOKENS: 24 at max_depth 10).
        min_length: fewest tokens of an expression (LRA: 501).
        max_length: most tokens of an expression, and the padded sequence length (LRA: 1999); at most 2**20.
        batch_size: sequences per training batch.
        train_samples: training sequences per epoch, drawn anew each epoch from (seed, epoch, index).
        val_samples: sequences of the fixed validation set.
        test_samples: sequences of the fixed test set.
        seed: the training stream's seed; the validation and test sets are the same for every seed.
        num_workers: DataLoader worker processes.
    """

    name = "ListOps"
    vocab_size = len(LISTOPS_TOKENS)

    def __init__(self, max_depth: int = 10, max_args: int = 10, min_length: int = 501, max_length: int = 1999,
                 batch_size: int = 32, train_samples: int = 96_000, val_samples: int = 500, test_samples: int = 2_000,
                 seed: int = 0, num_workers: int = 0):
        owner = "ListOps"
        self.max_depth = integer(max_depth, "max_depth", owner, 1, 100)  # the recursion goes this deep
        self.max_args = integer(max_args, "max_args", owner, 2)
        self.min_length = integer(min_length, "min_length", owner)
        # named as the user knows it, before it becomes sequence_length
        max_length = integer(max_length, "max_length", owner, maximum=MAX_LENGTH)
        most, fits = self._most_args(max_length)
        if self.max_args > most:
            why = ("an operator of more arguments is longer than max_length" if fits else
                   f"with more, an average draw holds more than {MAX_MEAN_TOKENS:,} tokens, and each tree is "
                   "built whole before its length is checked")
            raise ValueError(f"ListOps max_args must be between 2 and {most} with max_depth={self.max_depth} and "
                             f"max_length={max_length}, got {self.max_args}: {why}")
        longest = 1
        for _ in range(self.max_depth - 1):
            longest = 2 + self.max_args * longest
            if longest > 2**40:
                break
        if self.min_length > longest:
            raise ValueError(f"ListOps min_length={self.min_length} is longer than any tree of max_depth="
                             f"{self.max_depth} and max_args={self.max_args} (at most {longest} tokens)")
        super().__init__(max_length, None, batch_size, train_samples, val_samples, test_samples, seed, num_workers)
        self.expression(seed)  # one draw now: a range no tree falls in is refused here, not when data is loaded

    def _most_args(self, max_length: int) -> tuple[int, bool]:
        """The largest max_args this max_depth and max_length allow, and whether max_length is what bounds it."""
        fits = max(2, max_length - 2)
        if listops_mean_tokens(fits, self.max_depth) <= MAX_MEAN_TOKENS:
            return fits, True
        low, high = 2, fits  # the mean grows with max_args; at 2 it stays below 3 tokens, however deep
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if listops_mean_tokens(middle, self.max_depth) <= MAX_MEAN_TOKENS else (
                low, middle - 1)
        return low, False

    def arguments(self) -> dict:
        return {"max_depth": self.max_depth, "max_args": self.max_args, "min_length": self.min_length,
                "max_length": self.sequence_length}

    def check_length(self, length: int, name: str) -> None:
        if length < self.min_length:
            raise ValueError(f"ListOps max_length={length} must be >= min_length={self.min_length}")

    def tree(self, rnd: random.Random, depth: int) -> tuple[list[str], int]:
        """One expression as its tokens, and its value."""
        if depth < self.max_depth and rnd.random() < OPERATOR_P:
            operator, tokens, args = rnd.choice(OPERATORS), [], []
            for _ in range(rnd.randint(2, self.max_args)):
                sub, value = self.tree(rnd, depth + 1)
                tokens += sub
                args.append(value)
            return [operator, *tokens, "]"], listops_apply(operator, args)
        value = rnd.randrange(10)
        return [str(value)], value

    def expression(self, seed: int) -> tuple[list[str], int]:
        """The first tree of seed's draws whose length lies in [min_length, max_length]."""
        rnd = random.Random(seed)
        for _ in range(MAX_TRIES):
            tokens, value = self.tree(rnd, 1)
            if self.min_length <= len(tokens) <= self.sequence_length:
                return tokens, value
        raise ValueError(f"ListOps drew {MAX_TRIES:,} trees (max_depth={self.max_depth}, max_args={self.max_args}) "
                         f"and none had between min_length={self.min_length} and max_length={self.sequence_length} "
                         "tokens: widen the range or raise max_args")

    def example(self, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, value = self.expression(seed)
        x = torch.full((length,), PAD, dtype=torch.long)
        x[: len(tokens)] = torch.tensor([LISTOPS_IDS[t] for t in tokens])
        y = torch.full_like(x, IGNORE)
        y[len(tokens) - 1] = value
        return x, y
