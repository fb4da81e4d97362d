"""Reading a text file for a language model, with one clear line where it is not UTF-8 text.

Apart from the data modules (text.py) because `zoo evaluate` reads files too, and should not import Lightning.
"""

from __future__ import annotations

from pathlib import Path


def read_text(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{file} is not UTF-8 text: byte {e.start:,} is {e.object[e.start:e.start + 1]!r} "
                         f"({e.reason}); set data.path to a UTF-8 text file") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{file} is a folder; expected a UTF-8 text file") from None
