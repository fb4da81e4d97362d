"""`zoo push`: a release folder to the Hugging Face Hub."""

from __future__ import annotations

import argparse


def push_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="zoo push", description="Upload a release folder to the Hugging Face Hub (token from huggingface_hub's "
                                     "usual places: HF_TOKEN or `hf auth login`).")
    parser.add_argument("source", help="a release folder, a registered name with weights (name.tag) or a .ckpt")
    parser.add_argument("--repo", required=True, help="the Hub repository, org/name")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="the branch to commit to (created when missing); default main")
    parser.add_argument("--config", help="for a .ckpt: the recipe it was trained with, to measure metrics")
    args = parser.parse_args(argv)

    from zoo.release.push import push

    url = push(args.source, args.repo, private=args.private, revision=args.revision, config=args.config)
    print(f"pushed {args.source} to {url}")
