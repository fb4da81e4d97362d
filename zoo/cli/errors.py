"""What the `zoo` command prints for an error a user can fix: one line, `zoo <command>: error: ...`.

The libraries under the CLI each speak their own way: jsonargparse explains a bad value in
a dozen indented lines (its union of types, their errors, the value given), Lightning raises
MisconfigurationException, PIL, numpy, huggingface_hub and httpx their own classes. All of
them are turned into one line here; `--debug` (or ZOO_DEBUG=1) keeps the traceback.
Anything else is a bug in zoo and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
import sys

# (module, class) of the errors that mean "the input is wrong", looked up only in modules
# already imported: an error class of a library that was never imported cannot be raised.
_LIBRARY_ERRORS = (
    ("lightning.fabric.utilities.exceptions", "MisconfigurationException"),
    ("PIL.Image", "DecompressionBombError"),
    ("PIL", "UnidentifiedImageError"),
    ("httpx", "HTTPError"),
    ("huggingface_hub.errors", "HfHubHTTPError"),
    ("yaml", "YAMLError"),
    ("safetensors", "SafetensorError"),
)


def expected_errors() -> tuple[type[BaseException], ...]:
    """The error classes that say the user's input is wrong, rather than that zoo has a bug."""
    classes = [OSError, ValueError, TypeError, ImportError, argparse.ArgumentError]
    for module, name in _LIBRARY_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            classes.append(cls)
    return tuple(classes)


_SKIPPED = ("Does not validate against", "Subtypes:", "Errors:", "Given value type:", "Problem with given class_path",
            "Expected a <class 'NoneType'>")


def _type_name(text: str) -> str:
    """jsonargparse's `<class 'int'>` as `int`, `typing.Literal['a', 'b']` as `'a', 'b'`."""
    text = re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", text)
    return re.sub(r"typing\.Literal\[(.*)\]", r"\1", text)


def condense_parser_message(text: str) -> str:
    """jsonargparse's many-line account of a value that did not parse, as one line:
    `KEY: expected TYPES; got VALUE`, or `KEY: REASON` when a constructor refused the value."""
    keys, expected, reasons, given = [], [], [], None
    for line in (raw.strip() for raw in text.splitlines()):
        line = line.removeprefix("- ").strip()
        if not line:
            continue
        key = re.fullmatch(r'Parser key "([^"]+)":?(.*)', line)
        if key:
            keys.append(key.group(1))
            line = key.group(2).strip()
            if not line:
                continue
        if line.startswith("Given value:"):
            given = line.removeprefix("Given value:").strip()
        elif line.startswith(_SKIPPED):
            continue
        elif line.startswith("Expected a "):
            kind, _, got = line.removeprefix("Expected a ").partition(". Got value:")
            expected.append(_type_name(kind))
            given = given or got.strip() or None
        else:
            reasons.append(_type_name(line))
    where = ".init_args.".join(keys[:2]) + "".join(f".{k}" for k in keys[2:]) if keys else ""
    if reasons:  # a constructor's or a file's own words say more than the types
        message = "; ".join(dict.fromkeys(reasons))
    elif expected:
        message = f"expected {' or '.join(dict.fromkeys(expected))}"
        if given and given.startswith("NestedArg("):  # NestedArg(key='lr', val='nan')
            given = re.sub(r"NestedArg\(key=.*?, val=(.*)\)", r"\1", given).strip("'\"")
        if given and not given.startswith("Namespace("):
            message += f"; got {given!r}"
    else:
        message = text.strip()
    return f"{where}: {message}" if where else message


def one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if "Parser key" in text or "Does not validate against" in text:
        text = condense_parser_message(text)
    if isinstance(error, UnicodeDecodeError):
        text = f"not UTF-8 text ({text})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines)
