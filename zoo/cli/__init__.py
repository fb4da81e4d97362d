"""The `zoo` command: Lightning's CLI for fit/validate/test/predict, and zoo's own tools, one file each here.

    zoo fit --config quickstart            (a packaged recipe by name, or any recipe file)
    zoo recipes
    zoo models 'micro-*'
    zoo export runs/.../checkpoints/best.ckpt out/my-model [--config recipe.yaml]
    zoo export micro-vit-tiny.mnist out/micro-vit-onnx --format onnx
    zoo push checkpoints/micro-vit-tiny.mnist --repo my-org/micro-vit-tiny-mnist
    zoo check micro-vit-tiny.mnist --data-root ../shared/data
    zoo generate micro-gpt-tiny.shakespeare --prompt "ROMEO:"
    zoo viz micro-vit-tiny.mnist --out pictures/micro-vit --data-root ../shared/data
    zoo report --out report --data-root ../shared/data
    zoo evaluate gpt-tiny.shakespeare other.txt
    zoo leaderboard --recipe my.yaml --models vit-tiny,micro-vit-tiny --seeds 3
    zoo build-kernels
"""

from __future__ import annotations

import importlib
import os
import select
import sys

LIGHTNING = {"fit": "train a model from a recipe (Lightning's CLI; --help lists every option)",
             "validate": "measure a checkpoint on a recipe's validation split",
             "test": "measure a checkpoint on a recipe's test split",
             "predict": "run a checkpoint over a recipe's predict data"}
HELP = {**LIGHTNING,
        "models": "list the registered models (a wildcard selects some)",
        "recipes": "list the packaged recipes that --config accepts by name",
        "export": "write a checkpoint or model as a release folder or ONNX graphs",
        "push": "upload a release folder to the Hugging Face Hub",
        "check": "measure release folders again and compare them with their cards",
        "generate": "sample text from a language model",
        "evaluate": "loss, perplexity and bits per byte of a language model on any text file",
        "viz": "draw a model's attention and activations for an input",
        "report": "build the HTML report page of checkpoints and benchmarks",
        "leaderboard": "train several models with one recipe, several seeds each, and print the table",
        "build-kernels": "build the compiled CPU kernels now, rather than on first use"}


# Each command's module and function, imported when it runs: `zoo --help` imports none of them.
COMMANDS = {**{name: ("zoo.cli.lightning", "run_lightning") for name in LIGHTNING},
            "models": ("zoo.cli.models", "models_command"), "recipes": ("zoo.cli.models", "recipes_command"),
            "export": ("zoo.cli.export", "export_command"), "push": ("zoo.cli.push", "push_command"),
            "check": ("zoo.cli.check", "check_command"), "generate": ("zoo.cli.generate", "generate_command"),
            "evaluate": ("zoo.cli.evaluate", "evaluate_command"), "viz": ("zoo.cli.viz", "viz_command"),
            "report": ("zoo.cli.report", "report_command"),
            "leaderboard": ("zoo.cli.leaderboard", "leaderboard_command"),
            "build-kernels": ("zoo.cli.kernels", "build_kernels_command")}


def usage() -> str:
    width = max(map(len, HELP))
    rows = "\n".join(f"  {name.ljust(width)}  {text}" for name, text in HELP.items())
    return (f"usage: zoo COMMAND [options]   (zoo COMMAND --help for a command's options)\n\n"
            f"A PyTorch Lightning model zoo of lightweight attention mechanisms.\n\ncommands:\n{rows}\n\n"
            "options:\n  --version  print the version and exit\n"
            "  --debug    show the traceback of an error (or set ZOO_DEBUG=1)\n"
            "  --verbose  fit, validate, test, predict: also print Lightning's tips and start-up lines and the\n"
            "             libraries' deprecation warnings, left out by default (or set ZOO_VERBOSE=1)\n")


def version() -> str:
    from zoo import __version__

    return f"attention-zoo {__version__} (import name zoo)"


def main(argv: list[str] | None = None) -> None:
    try:
        _run(argv)
        sys.stdout.flush()  # so that a reader who left early is noticed here rather than at interpreter exit
    except BrokenPipeError:
        if not reader_has_left():
            raise  # a connection elsewhere broke, and --debug asked for its traceback
        # `zoo models | head`: the reader has what it wanted. As Python's docs advise, send the rest of the
        # output nowhere and leave quietly, with the status a tool killed by SIGPIPE would have (128 + 13).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141) from None


def reader_has_left() -> bool:
    """Whether our stdout is a pipe nobody reads any more, so that a broken connection elsewhere (an upload,
    say) is still reported as an error rather than taken for `| head`."""
    if not hasattr(select, "poll"):  # Windows: no way to ask, so trust the error
        return True
    try:
        descriptor = sys.stdout.fileno()
    except (OSError, ValueError):  # no file behind stdout (a capture in tests): it cannot be a closed pipe
        return False
    poller = select.poll()
    poller.register(descriptor, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _run(argv: list[str] | None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours = argv[: argv.index("--")] if "--" in argv else argv  # what follows `--` is passed on untouched
    debug = "--debug" in ours or os.environ.get("ZOO_DEBUG", "") not in ("", "0")
    argv = [a for a in ours if a != "--debug"] + argv[len(ours):]
    if not argv:  # no command is a usage error, as with argparse: the usage on stderr, status 2
        sys.stderr.write(usage())
        raise SystemExit(2)
    if argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return
    if argv[0] in ("-V", "--version"):
        print(version())
        return
    command = argv[0]
    if command not in HELP:
        import difflib

        close = difflib.get_close_matches(command, list(HELP), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise SystemExit(f"zoo: error: unknown command {command!r}{hint} (zoo --help lists them)")
    from zoo.cli.errors import expected_errors, one_line
    from zoo.utils.quiet import quiet_deprecations, verbose_requested

    try:
        module, function = COMMANDS[command]
        if command in LIGHTNING:  # quiet as its own --verbose says (zoo/cli/lightning.py)
            getattr(importlib.import_module(module), function)(argv)
        else:
            with quiet_deprecations(not verbose_requested()):
                getattr(importlib.import_module(module), function)(argv[1:])
    except KeyboardInterrupt:
        raise SystemExit(f"zoo {command}: interrupted") from None
    except Exception as error:
        if isinstance(error, BrokenPipeError) and reader_has_left():
            raise  # not the user's input at fault: main() ends quietly
        if debug or not isinstance(error, expected_errors()):
            raise
        raise SystemExit(f"zoo {command}: error: {one_line(error)}") from None

