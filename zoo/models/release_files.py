"""The files of a release folder (config.json, model.safetensors, README.md), read without trusting them.

config.json is parsed with limits on depth and integer size and checked against the registered
architectures; model.safetensors is read header first (shapes and dtypes, no tensor data), then
only the tensors wanted, mapped rather than read whole. Nothing here is ever unpickled.
"""

from __future__ import annotations

import inspect
import json
import math
import os
from pathlib import Path

import torch

from zoo.models.registry import ARCHITECTURES, PLUGINS, _entries, load_plugins

CONFIG, WEIGHTS, CARD = "config.json", "model.safetensors", "README.md"
RELEASE_FILES = (CONFIG, WEIGHTS, CARD)
FORMAT_VERSION = 1


def is_release_folder(path) -> bool:
    """A folder that zoo wrote: nothing but release files, and a config.json with zoo's format_version."""
    path = Path(path)
    try:
        if not {p.name for p in path.iterdir()} <= set(RELEASE_FILES) or not (path / CONFIG).is_file():
            return False
        config = parse_json((path / CONFIG).read_bytes(), path / CONFIG)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "format_version" in config and "class" in config


MAX_DEPTH = 32  # zoo's configs nest 3 levels; json itself fails (RecursionError) near 1000
MAX_DIGITS = 100  # Python refuses to read integers of more than 4300 digits, without naming the field


class _LongInteger(str):
    """An integer literal too long to be a config value, kept as text until its field is known."""


def parse_json(data: bytes | str, file: Path):
    """A JSON document, refused in one line naming the file (and the field, for an overlong integer)."""
    try:
        value = json.loads(data, parse_int=lambda text: _LongInteger(text) if len(text) > MAX_DIGITS else int(text))
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not a UTF-8 text file; expected zoo's config.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise ValueError(f"{file} nests its JSON too deeply (more than {MAX_DEPTH} levels); "
                         "expected zoo's config.json") from None
    pending = [(value, "", 1)]  # walked without recursion: the depth is not known to be small yet
    while pending:
        item, where, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{file} nests its JSON {depth} levels deep at {where or 'the top'}; zoo reads at most "
                             f"{MAX_DEPTH} (expected zoo's config.json)")
        if isinstance(item, _LongInteger):
            raise ValueError(f"{file}: {where or 'the document'} is an integer of {len(item.lstrip('-')):,} digits; "
                             f"zoo reads integers of at most {MAX_DIGITS} digits")
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        pending += [(child, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key,
                     depth + 1) for key, child in children]
    return value


def read_config(data: bytes, file: Path) -> dict:
    """config.json's object, refused with the file and field named when it is not one zoo can read."""
    config = parse_json(data, file)
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, got a JSON {type(config).__name__}")
    version = config.get("format_version")
    if version is None:
        raise ValueError(f"{file} has no format_version: it was not written by zoo's save_pretrained")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{file}: format_version must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"{file} has format_version {version}, written by a newer zoo; this zoo "
                         f"reads format_version {FORMAT_VERSION}: upgrade zoo (pip install -U attention-zoo)")
    _entries()  # make sure every architecture is registered
    arch = config.get("class")
    if isinstance(arch, str) and arch not in ARCHITECTURES:
        load_plugins()
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        module = config.get("module")
        hint = (f"; it was saved from the module {module!r}: import it before zoo.load (its import registers "
                f"{arch}), or install a package that declares it under the {PLUGINS!r} entry point"
                if isinstance(module, str) and all(part.isidentifier() for part in module.split(".")) else "")
        raise ValueError(f"{file}: class {arch!r} is not a registered architecture{hint}; zoo knows "
                         f"{sorted(ARCHITECTURES)}")
    args = config.get("args")
    if not isinstance(args, dict):
        raise ValueError(f"{file}: args must be a JSON object of {arch}'s arguments, got {type(args).__name__}")
    accepted = inspect.signature(ARCHITECTURES[arch]).parameters
    open_ended = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())  # a subclass's **kwargs
    unknown = [] if open_ended else sorted(set(args) - set(accepted))
    if unknown:
        raise ValueError(f"{file}: args.{unknown[0]} is not an argument of {arch}; it takes {', '.join(accepted)}")
    return config


FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}  # with their sizes in bytes
MAX_HEADER = 100_000_000  # safetensors' own limit on the header
SHOWN = 10  # names listed in an error; the rest are counted


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - SHOWN:,} more" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


def read_header(fd: int, file: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a safetensors file declares, read from its header alone (os.pread: no tensor
    data is read). Refused with a reason when the file is truncated, not safetensors, declares tensors it
    does not hold, or anything but floating-point tensors (zoo's weights are all floating point)."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise ValueError(f"{file} is not a safetensors file: {size} bytes, too short for a header")
    length = int.from_bytes(os.pread(fd, 8, 0), "little")
    if length > size - 8:
        raise ValueError(f"{file} is truncated or not a safetensors file: its header should take {length:,} bytes, "
                         f"the file holds {size - 8:,} after the length")
    if length > MAX_HEADER:
        raise ValueError(f"{file} is not a safetensors file zoo reads: its header takes {length:,} bytes, "
                         f"more than safetensors' limit of {MAX_HEADER:,}")
    try:
        header = json.loads(os.pread(fd, length, 8))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError(f"{file} is not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file: its header is not a JSON object")
    shapes, data_size, end = {}, size - 8 - length, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"{file}: tensor {name!r} is stored as {dtype}; zoo's weights are floating point "
                             f"({', '.join(FLOAT_DTYPES)}), and other types are never cast silently")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (_whole_numbers(shape) and _whole_numbers(offsets) and len(offsets) == 2
                and offsets[1] - offsets[0] == math.prod(shape) * FLOAT_DTYPES[dtype]):
            raise ValueError(f"{file} is not a valid safetensors file: tensor {name!r} declares shape {shape} "
                             f"and data offsets {offsets}, which do not agree")
        shapes[name], end = tuple(shape), max(end, offsets[1])
    if end > data_size:
        raise ValueError(f"{file} is truncated or not a safetensors file: its header declares {end:,} bytes of "
                         f"tensors, the file holds {data_size:,} after the header")
    return shapes


def _whole_numbers(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


def read_tensors(fd: int, names: list[str], file: Path) -> dict[str, torch.Tensor]:
    """The tensors `names` of the open safetensors file `fd`, mapped from it (mmap) rather than read whole: only
    these tensors' bytes are ever touched. Each must hold finite values."""
    from safetensors import SafetensorError, safe_open

    # The same open file by name (a magic link on Linux, /dev/fd elsewhere): the version read_folder opened.
    source = next((p for p in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}") if os.path.exists(p)), None)
    try:
        if source is None:  # no such names for open files on this system: read the file through the handle
            from safetensors.torch import load

            everything = load(os.pread(fd, os.fstat(fd).st_size, 0))
            state = {name: everything[name] for name in names}
        else:
            with safe_open(source, framework="pt") as f:
                state = {name: f.get_tensor(name) for name in names}
    except SafetensorError as e:
        raise ValueError(f"{file} is not a valid safetensors file: {e}") from None
    for name, tensor in state.items():  # a NaN weight makes every output NaN: say so at load, not later
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{file}: tensor {name!r} holds NaN or infinite values (a diverged or damaged "
                             "checkpoint); zoo loads only finite weights")
    return state


