"""Throughput of the zoo's models against timm's ViT, and generation speed against context length.

    python bench/models.py            # full run (about 10 minutes on 2 cores)
    python bench/models.py --quick    # fewer repetitions, contexts up to 4k

1. Training (forward, backward, AdamW step) and inference images per second at 28x28,
   batch 128, fp32 and bf16 autocast, for vit-tiny, quiet-vit-tiny and micro-vit-tiny and
   for timm's VisionTransformer of the same width, depth, heads, MLP ratio and patch size;
   the ratio is timm's time over ours (above 1: ours is faster). The two are timed in
   alternation so that drift hits both alike.
2. Decoding: after a prompt of `context` tokens, seconds per generated token with the
   KV cache (gpt, quiet-gpt) or the recurrent state (micro-gpt, elita-gpt), context 256
   to 16k, batch 1, fp32, random weights (speed does not depend on them).

Results go to bench/results/models.json. Run it on an idle machine: on 2 cores, any
other process changes the figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import zoo  # noqa: E402
from bench.common import print_table, timeit, timeit_pair, write_json  # noqa: E402

IMAGE_MODELS = ["vit-tiny", "quiet-vit-tiny", "micro-vit-tiny"]
TEXT_MODELS = ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny"]
BATCH = 128


def timm_twin(model):
    """timm's VisionTransformer with our model's dimensions (class token, learned positions)."""
    from timm.models.vision_transformer import VisionTransformer

    c = model.config
    return VisionTransformer(img_size=c["img_size"], patch_size=c["patch_size"], in_chans=c["in_chans"],
                             num_classes=c["num_classes"], embed_dim=c["embed_dim"], depth=c["depth"],
                             num_heads=c["num_heads"], mlp_ratio=c["mlp_ratio"])


def train_step(model, x, y, bf16: bool):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def infer_step(model, x, bf16: bool):
    @torch.inference_mode()
    def step():
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            model(x)

    return step


def image_rows(quick: bool) -> list[dict]:
    rows = []
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    for name in IMAGE_MODELS:
        ours = zoo.create(name)
        twin = timm_twin(ours)
        for precision in ("fp32", "bf16"):
            bf16 = precision == "bf16"
            for mode in ("train", "infer"):
                make = train_step if mode == "train" else infer_step
                args = (x, y, bf16) if mode == "train" else (x, bf16)
                for m in (ours, twin):
                    m.train(mode == "train")
                t_timm, t_ours = timeit_pair(make(twin, *args), make(ours, *args), rounds=10 if quick else 30,
                                             min_time=2.0 if quick else 6.0)
                rows.append({"model": name, "precision": precision, "mode": mode,
                             "params": sum(p.numel() for p in ours.parameters()),
                             "timm_params": sum(p.numel() for p in twin.parameters()),
                             "ours_img_per_s": BATCH / t_ours, "timm_img_per_s": BATCH / t_timm,
                             "speedup_vs_timm": t_timm / t_ours})
                print_table("progress", rows[-1:], list(rows[-1]))
    return rows


@torch.inference_mode()
def decode_seconds_per_token(model, context: int, new_tokens: int) -> float:
    prompt = torch.randint(0, model.vocab_size, (1, context))
    logits, states = model.forward_step(prompt)
    token = logits[:, -1:].argmax(-1)

    def run():
        position = context
        s = states
        for _ in range(new_tokens):
            logits, s = model.forward_step(token, s, start=position)
            position += 1
        return logits

    return timeit(run, min_time=2.0, max_reps=9) / new_tokens


def decode_rows(contexts: list[int], new_tokens: int) -> list[dict]:
    rows = []
    for name in TEXT_MODELS:
        # learned positions need a table as long as the longest context
        model = zoo.create(name, context_length=max(contexts) + new_tokens + 1).eval()
        for context in contexts:
            t = decode_seconds_per_token(model, context, new_tokens)
            rows.append({"model": name, "context": context, "ms_per_token": 1000 * t, "tokens_per_s": 1 / t})
            print_table("progress", rows[-1:], list(rows[-1]))
    return rows


def summary(image: list[dict], decode: list[dict]) -> list[dict]:
    out = []
    for r in image:
        if r["model"] == "micro-vit-tiny" and r["mode"] == "train":
            out.append({"target": f"micro-vit-tiny trains >= 1.3x faster than timm ViT ({r['precision']})",
                        "value": round(r["speedup_vs_timm"], 3), "met": r["speedup_vs_timm"] >= 1.3})
    for name in IMAGE_MODELS:  # what `--trainer.precision bf16-mixed` buys
        for mode in ("train", "infer"):
            rate = {r["precision"]: r["ours_img_per_s"] for r in image if r["model"] == name and r["mode"] == mode}
            out.append({"target": f"{name} {mode}: bf16 autocast speed-up over fp32 (measured, no target)",
                        "value": round(rate["bf16"] / rate["fp32"], 3), "met": ""})
    for name in TEXT_MODELS:
        times = [r["ms_per_token"] for r in decode if r["model"] == name]
        spread = max(times) / min(times)
        flat = name.startswith(("micro", "elita"))
        out.append({"target": f"{name} decode time per token, max / min over contexts"
                              + (" (flat: <= 1.5)" if flat else " (grows with context)"),
                    "value": round(spread, 3), "met": spread <= 1.5 if flat else ""})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, contexts up to 4k")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens generated per timing")
    args = parser.parse_args()
    torch.manual_seed(0)
    contexts = [256, 1024, 4096] if args.quick else [256, 1024, 4096, 16384]
    image = image_rows(args.quick)
    decode = decode_rows(contexts, args.new_tokens)
    targets = summary(image, decode)
    print_table("Training and inference at 28x28, batch 128 (speedup = timm time / ours)", image,
                ["model", "precision", "mode", "params", "timm_params", "ours_img_per_s", "timm_img_per_s",
                 "speedup_vs_timm"])
    print_table(f"Decoding {args.new_tokens} tokens after a prompt, batch 1, fp32", decode,
                ["model", "context", "ms_per_token", "tokens_per_s"])
    print_table("Targets", targets, ["target", "value", "met"])
    path = write_json("models", {"quick": args.quick, "image": image, "decode": decode, "targets": targets})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
