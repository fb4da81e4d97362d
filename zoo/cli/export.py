"""`zoo export`: a checkpoint or a model to a release folder or to ONNX graphs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def export_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="zoo export", description="A Lightning checkpoint, or any model zoo.load reads, to a release "
                                       "folder (safetensors, config.json, card) or to ONNX graphs checked in ONNX "
                                       "Runtime.")
    parser.add_argument("source", help="a Lightning checkpoint (.ckpt), or a name[.tag], a release folder or "
                                       "hf-hub:org/repo")
    parser.add_argument("outdir")
    parser.add_argument("--format", choices=("release", "onnx"), default="release",
                        help="release: a release folder (default); onnx: model.onnx (and prefill.onnx and "
                             "step.onnx for text models), checked against PyTorch in ONNX Runtime")
    parser.add_argument("--config", help="the recipe a checkpoint was trained with: measure test metrics for the "
                                         "card")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTDIR if it already holds a folder of "
                                                                 "the same format (anything else is never replaced)")
    args = parser.parse_args(argv)

    looks_like_a_path = "/" in args.source or args.source.endswith(".ckpt")
    if looks_like_a_path and not args.source.startswith("hf-hub:") and not Path(args.source).exists():
        raise FileNotFoundError(f"no checkpoint file at {args.source} (nor a release folder)")
    if args.format == "release" and Path(args.source).is_file():
        from zoo.release.export import export_checkpoint

        path, metrics = export_checkpoint(args.source, args.outdir, args.config, overwrite=args.overwrite)
        print(f"exported {path}" + (f" with {metrics}" if metrics else ""))
        return
    if args.config:
        raise ValueError("--config measures a checkpoint's metrics for a release folder's card; it has no use here")
    from zoo.models.registry import checkpoint_folder
    from zoo.models.release_files import is_release_folder
    from zoo.release.export import check_export_path, read_task, refuse_nonfinite
    from zoo.release.onnx import export_onnx, is_onnx_folder

    ours, what = (is_onnx_folder, "ONNX export folder") if args.format == "onnx" else (is_release_folder,
                                                                                        "release folder")
    source = None  # the file or folder the model is read from (none for the Hub: its cache is not the user's)
    if not args.source.startswith("hf-hub:"):
        source = Path(args.source) if Path(args.source).exists() else checkpoint_folder(args.source)
    check_export_path(args.outdir, {"the model it exports": source}, args.overwrite, ours, what)
    if source is not None and source.is_dir() and Path(os.path.realpath(source)) in Path(
            os.path.realpath(args.outdir)).parents:
        raise ValueError(f"the export folder {args.outdir} lies inside the release folder it exports ({source}); "
                         "choose a folder outside it")
    if Path(args.source).is_file():
        model = read_task(args.source).model
        refuse_nonfinite(model, args.source)
    else:
        from zoo.models.pretrained import load

        model = load(args.source)
    if args.format == "release":
        print(f"exported {model.save_pretrained(args.outdir, overwrite=args.overwrite)}")
        return
    path, diffs = export_onnx(model, args.outdir, overwrite=args.overwrite, source=args.source)
    checks = ", ".join(f"{name} {diff:.2e}" for name, diff in diffs.items())
    print(f"exported {path}: largest absolute difference from PyTorch in ONNX Runtime: {checks}")
