"""`zoo check`: release folders measured again against their cards."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def check_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="zoo check", description="Measure shipped (or any) release folders again and compare with their cards.")
    parser.add_argument("sources", nargs="*", help="names with tags (micro-vit-tiny.mnist) or folders; default: all "
                                                   "shipped checkpoints")
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA", "data"),
                        help="the folder that holds the data sets (default: $ZOO_DATA, else ./data)")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args(argv)

    from zoo.models.registry import checkpoint_folder
    from zoo.release.check import check, check_table_path, prepared_data, shipped_folders

    folders = [Path(s) if Path(s).is_dir() else checkpoint_folder(s) for s in args.sources] or shipped_folders()
    if args.json:
        check_table_path(args.json, folders)
    prepared = [prepared_data(folder, args.data_root) for folder in folders]  # every data set there, before work
    rows = []
    for folder, data in zip(folders, prepared):
        for row in check(folder, args.data_root, data):
            rows.append({"release": folder.name, **row})
            print(f"{folder.name:34s} {row['metric']:14s} card {row['card']:<9} measured {row['measured']:<9} "
                  f"diff {row['diff_points']:.3f} points  {'ok' if row['ok'] else 'MISMATCH'}", flush=True)
    if args.json:
        from zoo.utils.atomic import write_json_atomic

        write_json_atomic(args.json, rows)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        raise SystemExit(f"{len(bad)} metric(s) differ from their card by more than the tolerance")
