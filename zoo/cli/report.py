"""zoo report: one HTML page of the checkpoints, their pictures and the benchmarks."""

from __future__ import annotations

import os

from zoo.release import report
from zoo.utils.atomic import check_replaceable


def report_command(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="zoo report", description=report.__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the folder to write index.html in")
    parser.add_argument("--bench", default="bench/results", help="the benchmarks' JSON files (default bench/results)")
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA"),
                        help="the data sets, for one input picture per image checkpoint (default: $ZOO_DATA)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if an earlier zoo report wrote it")
    args = parser.parse_args(argv)
    check_replaceable(args.out, report.is_report_folder, "report folder", args.overwrite)
    path = report.build_report(args.out, args.bench, args.data_root, args.overwrite)
    print(f"wrote {path / 'index.html'}")
