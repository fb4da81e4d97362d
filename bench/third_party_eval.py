"""A client nobody here wrote: lm-evaluation-harness scores zoo text checkpoints through transformers, and its
perplexity is checked against `zoo evaluate` on the same text.

    pip install lm_eval          # bench-only (not a zoo dependency); offline once installed
    python bench/third_party_eval.py [--data-root ../shared/data] [--chars 20000]

lm-evaluation-harness (EleutherAI's `lm_eval`) loads each checkpoint folder with its own HFLM wrapper, i.e.
`AutoConfig` / `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained(folder)` (zoo registers its text
models there on import), and runs a wikitext-style task (`loglikelihood_rolling`, metrics word_perplexity,
byte_perplexity, bits_per_byte) written here over a local text file: the last `--chars` characters of
tinyshakespeare (inside the validation split the shipped Shakespeare models were measured on).

The same windows in both: `zoo evaluate` cuts the tokens into non-overlapping windows of context_length + 1
and predicts every token but the first, from the tokens before it in its window. lm_eval's rolling windows
predict every token of the document, the first from a prefix token, and each later window from the
context_length tokens before it. Given the text without its first character as the document, and that
character's id as the prefix token (HFLM's prefix_token_id), lm_eval's windows are exactly zoo's, so the two
total log-likelihoods must agree to float rounding (lm_eval batches windows and pads the last, shorter one,
which may change the last bits of a sum). Without that alignment (lm_eval's default prefix, the EOS or BOS token, which
zoo's character tokenizers do not have) every window would be shifted by one token.

Writes bench/results/third_party_eval.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: the task's file and the checkpoint folders
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import zoo  # noqa: E402,F401  (registers the text models with transformers)
from bench.common import print_table, write_json  # noqa: E402
from zoo.training.evaluate import evaluate_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ["gpt-tiny.shakespeare", "hybrid-elita-conv-gpt-tiny.shakespeare", "micro-gpt-tiny.shakespeare"]
TASK = """task: {name}
dataset_path: text
dataset_kwargs:
  data_files:
    test: {file}
  sample_by: document
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
should_decontaminate: false
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def lm_eval_scores(folder: Path, document: Path, prefix_id: int, context: int, work: Path) -> dict:
    """lm_eval's wikitext-style task over `document` for the checkpoint `folder`, and its total log-likelihood."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    name = "zoo_local_text"
    (work / f"{name}.yaml").write_text(TASK.format(name=name, file=document))
    model = HFLM(pretrained=str(folder), backend="causal", batch_size=16, max_length=context, device="cpu",
                 prefix_token_id=prefix_id)
    out = lm_eval.simple_evaluate(model=model, tasks=[name], task_manager=TaskManager(include_path=str(work)),
                                  log_samples=True, bootstrap_iters=0)
    metrics = {k.split(",")[0]: v for k, v in out["results"][name].items() if isinstance(v, float)}
    loglikelihoods = [s["resps"][0][0] for s in out["samples"][name]]  # one document, one rolling log-likelihood
    return {**metrics, "loglikelihood": float(sum(loglikelihoods)), "model_class": type(model.model).__name__,
            "tokenizer_class": type(model.tokenizer).__name__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--chars", type=int, default=20_000, help="the last this many characters of tinyshakespeare")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import lm_eval

    source = Path(args.data_root) / "tinyshakespeare" / "input.txt"
    text = source.read_text()[-args.chars:]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        whole, document = work / "text.txt", work / "document.txt"
        for name in CHECKPOINTS:
            folder = ROOT / "checkpoints" / name
            model = zoo.load(folder)
            context = model.context_length
            # Whole windows only: lm_eval gives a last, shorter window the full context before it, where zoo
            # evaluate starts it afresh (both are right; they differ). Character tokenizers: a character a token.
            used = text[: 1 + (len(text) - 1) // context * context]
            whole.write_text(used)
            document.write_text(used[1:])  # the first character becomes lm_eval's prefix token (see the docstring)
            start = time.perf_counter()
            ours = evaluate_text(folder, whole, context_length=context)
            zoo_seconds = time.perf_counter() - start
            start = time.perf_counter()
            theirs = lm_eval_scores(folder, document, model.tokenizer.encode(used[0])[0], context, work)
            lm_seconds = time.perf_counter() - start
            zoo_loglikelihood = -ours["loss"] * ours["tokens"]
            zoo_bpb = ours["bits_per_byte"]
            rows.append({
                "checkpoint": name, "model_class": theirs["model_class"], "tokenizer_class": theirs["tokenizer_class"],
                "tokens": ours["tokens"], "bytes": ours["bytes"], "context_length": context,
                "zoo_loglikelihood": zoo_loglikelihood, "lm_eval_loglikelihood": theirs["loglikelihood"],
                "abs_difference": abs(zoo_loglikelihood - theirs["loglikelihood"]),
                "relative_difference": abs(zoo_loglikelihood - theirs["loglikelihood"]) / abs(zoo_loglikelihood),
                "zoo_perplexity": ours["perplexity"],
                "lm_eval_token_perplexity": math.exp(-theirs["loglikelihood"] / ours["tokens"]),
                "zoo_bits_per_byte": zoo_bpb, "lm_eval_bits_per_byte": theirs["bits_per_byte"],
                "lm_eval_byte_perplexity": theirs["byte_perplexity"],
                "lm_eval_word_perplexity": theirs["word_perplexity"],
                "zoo_seconds": round(zoo_seconds, 2), "lm_eval_seconds": round(lm_seconds, 2),
            })
    print_table("lm-evaluation-harness against zoo evaluate (same windows)", rows,
                ["checkpoint", "tokens", "zoo_loglikelihood", "lm_eval_loglikelihood", "relative_difference",
                 "zoo_perplexity", "lm_eval_token_perplexity", "zoo_bits_per_byte", "lm_eval_bits_per_byte"])
    write_json("third_party_eval", {
        "tool": f"lm_eval {lm_eval.__version__} (EleutherAI lm-evaluation-harness), HFLM backend='causal'",
        "transformers": __import__("transformers").__version__,
        "command": "python bench/third_party_eval.py" + (f" --chars {args.chars}" if args.chars != 20_000 else ""),
        "text": f"the last {args.chars:,} characters of tinyshakespeare/input.txt (validation split), cut to whole "
                "windows of context_length + 1",
        "windows": "zoo evaluate's non-overlapping windows of context_length + 1; lm_eval's rolling windows with the "
                   "text's first character as prefix token and the rest as the document: the same windows",
        "rows": rows,
    })


if __name__ == "__main__":
    main()
