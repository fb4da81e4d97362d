"""`zoo build-kernels`: the compiled CPU kernels built ahead of their first use."""

from __future__ import annotations

import argparse
import os


def build_kernels_command(argv: list[str]) -> None:
    argparse.ArgumentParser(
        prog="zoo build-kernels", description="Build zoo's compiled CPU kernels (softmax_one, MicroAttention's and "
        "ELiTA's scans, the in-context bias and attention) now, once per installed copy and torch version, rather "
        "than on first use. They are cached under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions)."
    ).parse_args(argv)
    import time

    from zoo.attention import incontext_kernel, native

    if os.environ.get("ZOO_NATIVE", "1") == "0":
        raise ValueError("ZOO_NATIVE=0 turns the kernels off; unset it to build them")
    started = time.time()
    # the in-context attention kernel is an extension of its own (zoo/attention/incontext_kernel.py)
    if native.load() is None or incontext_kernel.load() is None:
        raise OSError("the kernels could not be built (the warning above says why); zoo runs the same numbers on "
                      "its eager routes")
    print(f"zoo's CPU kernels are ready in {native.build_folder()} ({time.time() - started:.0f} s)")
