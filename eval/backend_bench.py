"""Our lm-eval backend against lm-eval's HFLM on the same MMLU run: accuracy and wall time.

    python -m compress.eval.backend_bench --model smollm2-135m --num-fewshot 0

Both score the same requests (same prompts, same token ids); HFLM runs first, then ours with its
score cache off, one after the other in this process, so the time ratio is like for like.
"""

import json
import time

import click

from compress.models import resolve


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--num-fewshot", type=int, default=0, show_default=True)
@click.option("--limit", type=int, default=None, help="questions per subject [default: the full test set]")
@click.option("--hf-batch-size", type=int, default=16, show_default=True)
@click.option("--out", default=None, help="also write the results as JSON here")
def main(model, num_fewshot, limit, hf_batch_size, out):
    from lm_eval.models.huggingface import HFLM

    from compress.eval.harness import run_mmlu
    from compress.eval.lm_backend import CompressLM

    model_dir = resolve(model)
    backends = {
        f"hf (HFLM, batch {hf_batch_size})": lambda: HFLM(pretrained=str(model_dir), dtype="float32", device="cpu",
                                                           batch_size=hf_batch_size),
        "compress": lambda: CompressLM(str(model_dir), cache=False),
    }
    results, seconds = {}, {}
    for name, make in backends.items():
        start = time.perf_counter()
        results[name] = run_mmlu(make(), num_fewshot, limit)
        seconds[name] = time.perf_counter() - start
    (hf_name, hf), (_, ours) = results.items()
    print(f"MMLU {num_fewshot}-shot, {ours['all']['n']} questions, {model}")
    print("| backend | acc (micro) | acc (macro) | stem | humanities | social sciences | other | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        groups = " | ".join(f"{100 * r[g]['acc']:.2f}" for g in ("stem", "humanities", "social_sciences", "other"))
        print(f"| {name} | {100 * r['all']['acc']:.2f} | {100 * r['all']['acc_macro']:.2f} | {groups} | {seconds[name]:.0f} |")
    ratio = seconds["compress"] / seconds[hf_name]
    print(f"accuracy difference {100 * (ours['all']['acc'] - hf['all']['acc']):+.2f} points; "
          f"wall time ours / hf = {ratio:.2f}")
    if out:
        with open(out, "w") as f:
            json.dump({"results": results, "seconds": seconds}, f, indent=2)


if __name__ == "__main__":
    from compress.cli import run_command

    run_command(main)
