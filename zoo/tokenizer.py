"""Character-level tokenizer: every distinct character of the text it was built on is one token."""

from __future__ import annotations


class CharTokenizer:
    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer needs distinct characters")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            raise ValueError(f"characters not in the tokenizer's vocabulary of {self.vocab_size}: {unknown[:10]!r}")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict:
        return {"type": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, d: dict) -> CharTokenizer:
        if d.get("type") != "char":
            raise ValueError(f"expected a tokenizer of type 'char', got {d.get('type')!r}")
        return cls(d["chars"])


class BPETokenizer:
    """Byte-level BPE from the `tokenizers` library (pip install 'zoo[bpe]'): round-trips any text.

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
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_dict(self) -> dict:
        return {"type": "bpe", "json": self.tokenizer.to_str()}

    @classmethod
    def from_dict(cls, d: dict) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(d["json"]))


def _chunks(text: str, size: int = 1 << 16):
    for start in range(0, len(text), size):
        yield text[start : start + size]


TOKENIZERS = {"char": CharTokenizer, "bpe": BPETokenizer}


def tokenizer_from_dict(d: dict):
    """The tokenizer saved as `d` (its "type" names the kind)."""
    kind = d.get("type")
    if kind not in TOKENIZERS:
        raise ValueError(f"expected a tokenizer of type {sorted(TOKENIZERS)}, got {kind!r}")
    return TOKENIZERS[kind].from_dict(d)
