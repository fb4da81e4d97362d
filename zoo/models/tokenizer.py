"""Character-level tokenizer: every distinct character of the text it was built on is one token."""

from __future__ import annotations

import numbers
from collections.abc import Iterable

from zoo.utils.checks import shown

MAX_BPE_JSON = 10 * 2**20  # characters of a BPE tokenizer's saved JSON; a 50k-token vocabulary takes about 2 MB


def check_ids(ids, vocab_size: int, owner: str) -> list[int]:
    """Token ids (a list, array or tensor of integers) as a list of ints in [0, vocab_size): never a negative
    id that Python would count from the end of the vocabulary, nor a float rounded down."""
    if hasattr(ids, "tolist"):  # a tensor or an array
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{owner} takes a list of token ids, got {shown(ids)} ({type(ids).__name__})")
    ids = list(ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral):
            raise TypeError(f"{owner} token ids must be integers, got {shown(i)} ({type(i).__name__})")
        if not 0 <= i < vocab_size:
            raise ValueError(f"{owner} token ids must lie in [0, {vocab_size}), got {shown(i)}")
    return [int(i) for i in ids]


class CharTokenizer:
    def __init__(self, chars: str):
        if not isinstance(chars, str):
            raise TypeError(f"CharTokenizer chars must be a string (its vocabulary), got {shown(chars)} "
                            f"({type(chars).__name__})")
        if not chars or len(set(chars)) != len(chars):
            raise ValueError(f"CharTokenizer needs one or more distinct characters, got {shown(chars)}")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = self.unknown(text)
        if unknown:
            more = f" (the first 10 of {len(unknown)})" if len(unknown) > 10 else ""
            raise ValueError(f"characters not in the tokenizer's vocabulary of {self.vocab_size}: "
                             f"{unknown[:10]!r}{more}")
        return [self.index[c] for c in text]

    def unknown(self, text: str) -> list[str]:
        """The distinct characters of `text` this tokenizer cannot encode, in code point order."""
        return sorted(set(text) - self.index.keys())

    def decode(self, ids) -> str:
        return "".join(self.chars[i] for i in check_ids(ids, self.vocab_size, "CharTokenizer.decode"))

    def to_dict(self) -> dict:
        return {"type": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        if d.get("type") != "char":
            raise ValueError(f"expected a tokenizer of type 'char', got {shown(d.get('type'))}")
        if "chars" not in d:
            raise ValueError("a 'char' tokenizer needs its 'chars' field (the vocabulary as a string); it is missing")
        return cls(d["chars"])


class BPETokenizer:
    """Byte-level BPE from the `tokenizers` library (pip install 'attention-zoo[bpe]'): round-trips any text.

    Saved as the library's own JSON, so a release folder stays JSON and safetensors only.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def from_text(cls, text: str, vocab_size: int = 512) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tokenizer.train_from_iterator(_chunks(text), trainer=trainer)
        return cls(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids) -> str:
        return self.tokenizer.decode(check_ids(ids, self.vocab_size, "BPETokenizer.decode"), skip_special_tokens=False)

    def to_dict(self) -> dict:
        return {"type": "bpe", "json": self.tokenizer.to_str()}

    @classmethod
    def from_dict(cls, d: dict) -> BPETokenizer:
        from tokenizers import Tokenizer

        text = d.get("json")
        if not isinstance(text, str):
            raise TypeError(f"a 'bpe' tokenizer needs its 'json' field (the tokenizers library's JSON as a string), "
                            f"got {shown(text)}")
        if len(text) > MAX_BPE_JSON:
            raise ValueError(f"a 'bpe' tokenizer's JSON is {len(text):,} characters, more than the limit of "
                             f"{MAX_BPE_JSON:,} characters")
        try:
            return cls(Tokenizer.from_str(text))
        except Exception as e:  # the library raises plain Exceptions, with its parser's message
            raise ValueError(f"a 'bpe' tokenizer's JSON could not be read by the tokenizers library: "
                             f"{str(e).splitlines()[0][:200]}") from None


def _chunks(text: str, size: int = 1 << 16):
    for start in range(0, len(text), size):
        yield text[start : start + size]


TOKENIZERS = {"char": CharTokenizer, "bpe": BPETokenizer}


def describe(tokenizer) -> str:
    """ "character-level, 65 tokens" or "byte-level BPE, 512 tokens": a tokenizer in the words of a message."""
    kind = "character-level" if isinstance(tokenizer, CharTokenizer) else "byte-level BPE"
    return f"{kind}, {tokenizer.vocab_size} tokens"


def encode_text(tokenizer, text: str, where: str) -> list[int]:
    """`text` (from `where`, a file) as token ids, or a ValueError naming the characters the tokenizer lacks (the
    first ten, and how many) and the two ways out."""
    unknown = tokenizer.unknown(text) if isinstance(tokenizer, CharTokenizer) else []
    if unknown:
        more = f" (the first 10 of {len(unknown)})" if len(unknown) > 10 else ""
        raise ValueError(f"{where} has characters not in the model's tokenizer ({describe(tokenizer)}): "
                         f"{unknown[:10]!r}{more}. A character-level tokenizer encodes only the characters of the "
                         "text it was built on: use a byte-level BPE model (trained with tokenizer: bpe), which "
                         "encodes any text, or fine-tune this one with a new tokenizer (new_tokenizer: true)")
    return tokenizer.encode(text)


def tokenizer_from_dict(d: dict):
    """The tokenizer saved as `d` (its "type" names the kind)."""
    if not isinstance(d, dict):
        raise TypeError(f"a tokenizer is saved as a dict with a 'type', got {shown(d)}")
    kind = d.get("type")
    if not isinstance(kind, str) or kind not in TOKENIZERS:
        raise ValueError(f"expected a tokenizer of type {sorted(TOKENIZERS)}, got {shown(kind)}")
    return TOKENIZERS[kind].from_dict(d)
