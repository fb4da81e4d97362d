"""Planted bugs, and the tests that must catch each: a check that the suite's green means something.

Each mutation is a plausible one-line bug in zoo/ (a mask read the wrong way round, a scale, a causal offset, a
label order, what a release saves, a tokenizer's round trip, what swap carries over), with the tests that should
fail because of it. For each, the tree is copied to a temporary folder (checkpoints linked, not copied), the
line changed there, and those tests run on the copy: the mutation is caught when they fail. The working tree is
never touched. A mutation whose line is no longer in the code is an error, not a pass: update it with the code.

    python tests/mutations.py              # every mutation; exits 1 unless each is caught
    python tests/mutations.py --list       # their names
    python tests/mutations.py --only NAME  # one (repeatable)
    python tests/mutations.py --json FILE  # also write the results as JSON

The README's testing section reports its catch rate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to the repository


MUTATIONS = (
    Mutation("mask polarity: the MultiheadAttention adapter keeps PyTorch's boolean attn_mask as zoo's",
             "zoo/attention/swapping.py",
             "attn_mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask",
             "attn_mask = attn_mask",
             ("tests/test_mask_conventions.py::test_swapped_multihead_attention_matches_the_original",)),
    Mutation("mask polarity: the adapter keeps PyTorch's key_padding_mask (True = padding) as zoo's",
             "zoo/attention/swapping.py",
             "        return ~key_padding_mask\n",
             "        return key_padding_mask\n",
             ("tests/test_mask_conventions.py::test_swapped_multihead_attention_matches_the_original",)),
    Mutation("mask polarity: attend reads a boolean attn_mask as the keys it forbids",
             "zoo/attention/dot_product.py",
             "        allowed = allowed & attn_mask\n",
             "        allowed = allowed & ~attn_mask\n",
             ("tests/test_mask_conventions.py::test_attend_matches_scaled_dot_product_attention",)),
    Mutation("mask combination: padding lets every query see its own key again, a real one too",
             "zoo/attention/dot_product.py",
             "allowed = allowed | (own_key & padded_query[:, None, :, None])",
             "allowed = allowed | own_key",
             ("tests/test_mask_conventions.py",)),
    Mutation("scale: the explicit attention path divides the logits by d, not sqrt(d)",
             "zoo/attention/dot_product.py",
             "* q.shape[-1] ** -0.5",
             "* q.shape[-1] ** -1.0",
             ("tests/test_attention.py",)),
    Mutation("scale: fused attention's pooling scores divide by d, not sqrt(d)",
             "zoo/attention/fused.py",
             "* self.head_dim**-0.5",
             "* self.head_dim**-1.0",
             ("tests/test_attention.py::test_fused_matches_reference",)),
    Mutation("causal offset: queries after a KV cache are aligned to the start of the keys",
             "zoo/attention/dot_product.py",
             "        allowed = allowed.tril(diagonal=offset)\n",
             "        allowed = allowed.tril(diagonal=0)\n",
             ("tests/test_attention.py", "tests/test_generate.py")),
    Mutation("label order: an image folder's classes in reverse order",
             "zoo/data/folders.py",
             "    return sorted(names)\n",
             "    return sorted(names, reverse=True)\n",
             ("tests/test_data_sources.py",)),
    Mutation("label order: classify names each probability with another class's label",
             "zoo/models/classifier.py",
             "result = [[(labels[i], round(float(p), 4)) for p, i in zip(v, ix)]",
             "result = [[(labels[i], round(float(p), 4)) for p, i in zip(v, ix.flip(0))]",
             ("tests/test_models.py", "tests/test_finetune.py")),
    Mutation("saved normalization: config.json's pretrained_cfg without mean and std",
             "zoo/models/pretrained.py",
             "for k, v in model.data_cfg().items()}",
             "for k, v in model.data_cfg().items() if k not in (\"mean\", \"std\")}",
             ("tests/test_hub.py::test_timm_create_model_from_hub",)),
    Mutation("saved mechanism: swap leaves a zoo model's config naming the old attention",
             "zoo/models/pretrained.py",
             "            names[int(block.group(1))] = mechanism\n",
             "            names[int(block.group(1))] = names[int(block.group(1))]\n",
             ("tests/test_swap_round_trip.py",)),
    Mutation("saved mechanism: the save compares weight names and shapes only, not what each module is",
             "zoo/models/pretrained.py",
             "        if own_modules.get(name) != built_modules.get(name):\n",
             "        if False:\n",
             ("tests/test_swap_round_trip.py",)),
    Mutation("tokenizer round trip: a character tokenizer saves its vocabulary sorted",
             "zoo/models/tokenizer.py",
             "return {\"type\": \"char\", \"chars\": self.chars}",
             "return {\"type\": \"char\", \"chars\": \"\".join(sorted(self.chars))}",
             ("tests/test_models.py::test_a_tokenizer_round_trips_through_a_release_folder",)),
    Mutation("swap's projections: the output projection's bias is not carried over",
             "zoo/attention/swapping.py",
             "                    linear.bias.copy_(bias)\n",
             "                    linear.bias.zero_()\n",
             ("tests/test_swap.py", "tests/test_mask_conventions.py")),
    Mutation("swap's projections: cross-attention's queries through the key rows of qkv",
             "zoo/attention/softmax.py",
             "q = F.linear(x, weight[: self.dim], None if bias is None else bias[: self.dim])",
             "q = F.linear(x, weight[self.dim : 2 * self.dim], None if bias is None else "
             "bias[self.dim : 2 * self.dim])",
             ("tests/test_swap.py",)),
    Mutation("registration: the timm hook is used up by a find_spec before timm is imported",
             "zoo/release/import_hook.py",
             "        spec = None\n",
             "        sys.meta_path.remove(self)\n        spec = None\n",
             ("tests/test_import_order.py",)),
    # the field's yardsticks: their chunked training routes, padding, windows and decoding
    Mutation("chunk carry: the decayed sum reads the memory at a chunk's start without the decay since",
             "zoo/attention/linear_recurrence.py",
             "    out = within + (qc * torch.exp(g)) @ before\n",
             "    out = within + qc @ before\n",
             ("tests/test_yardsticks.py::test_chunked_decayed_sum_is_the_recurrence",)),
    Mutation("chunk carry: the delta rule's writes after the first chunk ignore what the memory held",
             "zoo/attention/linear_recurrence.py",
             "        written = new_c - keys_c @ state\n",
             "        written = new_c\n",
             ("tests/test_yardsticks.py::test_chunked_delta_rule_is_the_recurrence",)),
    Mutation("padding writes: DeltaNet's padded tokens write into the memory",
             "zoo/attention/deltanet.py",
             "beta = no_write(heads_first(torch.sigmoid(self.beta(x).float()), self.heads)[..., 0], real)",
             "beta = heads_first(torch.sigmoid(self.beta(x).float()), self.heads)[..., 0]",
             ("tests/test_yardsticks.py::test_a_left_padded_row_computes_the_row_unpadded",)),
    Mutation("window width: a window of W tokens sees W + 1",
             "zoo/attention/window.py",
             "    near = distance < window\n",
             "    near = distance <= window\n",
             ("tests/test_yardsticks.py::test_window_matches_float64_reference",)),
    Mutation("window blocks: a block reads its own padding as the padding of the block before",
             "zoo/attention/window.py",
             "keys_real = torch.cat([real[:, :-1], real[:, 1:]], 2)",
             "keys_real = torch.cat([real[:, 1:], real[:, 1:]], 2)",
             ("tests/test_yardsticks.py::test_window_blocks_equal_the_band_mask",)),
    Mutation("decoding: the short convolution hands the next step its first inputs, not its last",
             "zoo/attention/linear_recurrence.py",
             "        return out, h[:, h.shape[1] - (self.width - 1):].clone()\n",
             "        return out, h[:, :self.width - 1].clone()\n",
             ("tests/test_yardsticks.py::test_decoding_equals_the_parallel_forward",)),
)


def _copy(tree: Path) -> None:
    ignore = shutil.ignore_patterns(".git", "runs", "__pycache__", ".pytest_cache", "checkpoints", "site", "*.egg-info")
    shutil.copytree(REPO, tree, ignore=ignore, symlinks=True)
    (tree / "checkpoints").symlink_to(REPO / "checkpoints", target_is_directory=True)


def _env(tree: Path) -> dict:
    # the copy's zoo before the installed (editable) one; the data folder as the suite finds it from the checkout
    data = os.environ.get("ZOO_DATA", str(REPO.parent / "shared" / "data"))
    return {**os.environ, "PYTHONPATH": str(tree), "ZOO_DATA": data, "PYTHONDONTWRITEBYTECODE": "1"}


def _run_tests(mutation: Mutation | None, tests: tuple[str, ...]) -> subprocess.CompletedProcess:
    """`tests` on a copy of the tree with `mutation` planted (None: the tree as it is)."""
    with tempfile.TemporaryDirectory(prefix="zoo-mutation-") as tmp:
        tree = Path(tmp) / "repo"
        _copy(tree)
        if mutation is not None:
            source = (REPO / mutation.file).read_text()
            (tree / mutation.file).write_text(source.replace(mutation.old, mutation.new))
        env = _env(tree)
        where = subprocess.run([sys.executable, "-c", "import zoo; print(zoo.__file__)"], cwd=tree, env=env,
                               capture_output=True, text=True)
        if not where.stdout.strip().startswith(str(tree)):
            raise SystemExit(f"the copy's zoo is not the one imported ({where.stdout.strip() or where.stderr}); "
                             "the mutation would be tested on the unchanged code")
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:randomly", "-p",
                               "no:cacheprovider", "-n", "0", "-m", "not slow", *tests],
                              cwd=tree, env=env, capture_output=True, text=True)


def check(mutation: Mutation) -> dict:
    """Plant the mutation in a copy, run its tests there: {"name", "caught", "seconds", "output"}."""
    count = (REPO / mutation.file).read_text().count(mutation.old)
    if count != 1:
        raise SystemExit(f"mutation {mutation.name!r}: its line occurs {count} times in {mutation.file} "
                         f"(expected once): update it with the code")
    start = time.monotonic()
    done = _run_tests(mutation, mutation.tests)
    if done.returncode not in (0, 1):
        raise SystemExit(f"mutation {mutation.name!r}: its tests could not run (pytest exit {done.returncode}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    return {"name": mutation.name, "file": mutation.file, "tests": list(mutation.tests),
            "caught": done.returncode == 1, "seconds": round(time.monotonic() - start, 1),
            "output": (done.stdout + done.stderr)[-1500:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Plant named bugs in a copy of zoo/ and check that tests catch "
                                                 "each.")
    parser.add_argument("--list", action="store_true", help="print the mutations' names and exit")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="a mutation (repeatable)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(m.name for m in MUTATIONS))
        return 0
    unknown = [name for name in args.only if name not in {m.name for m in MUTATIONS}]
    if unknown:
        parser.error(f"unknown mutation {unknown[0]!r}; --list names them")
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    # the named tests pass on the tree as it is, so that a failure under a mutation is the mutation's doing
    targets = tuple(dict.fromkeys(test for m in chosen for test in m.tests))
    unchanged = _run_tests(None, targets)
    if unchanged.returncode != 0:
        raise SystemExit(f"the mutations' tests fail on the unchanged tree (pytest exit {unchanged.returncode}); "
                         f"fix them first:\n{(unchanged.stdout + unchanged.stderr)[-3000:]}")
    print(f"unchanged tree: the {len(targets)} test targets pass", flush=True)
    results = []
    for mutation in chosen:
        result = check(mutation)
        results.append(result)
        print(f"{'caught ' if result['caught'] else 'MISSED '} {mutation.name} ({result['seconds']} s)", flush=True)
        if not result["caught"]:
            print(f"  its tests passed: {' '.join(mutation.tests)}")
    caught = sum(r["caught"] for r in results)
    print(f"mutations: {caught} of {len(results)} caught")
    if args.json:
        args.json.write_text(json.dumps({"caught": caught, "total": len(results), "mutations": results},
                                        indent=2) + "\n")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
