"""lm-eval's `local-completions` model against `compress serve`, on a slice of MMLU, beside our
engine scored directly: the served API is what other tools see, and it must give the same answers.

    python -m compress.bench.server_mmlu --model smollm2-135m --limit 5

The server runs in this process on a free loopback port; lm-eval sends token ids with echo=True,
logprobs=1 and max_tokens=1, as it does against vLLM.
"""

import json
import time

import click

from compress.models import resolve
from compress.runtime.engine import LLM
from compress.runtime.local_server import running_server

SERVED_NAME = "compress-model"


def served_mmlu(model: str, num_fewshot: int, limit: int, concurrency: int) -> dict:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from compress.eval.harness import run_mmlu

    with running_server(LLM(model), SERVED_NAME) as (url, _):
        api = LocalCompletionsAPI(base_url=url + "/v1/completions", model=SERVED_NAME, tokenizer=str(resolve(model)),
                                  tokenizer_backend="huggingface", num_concurrent=concurrency, max_retries=1)
        return run_mmlu(api, num_fewshot, limit)


def direct_mmlu(model: str, num_fewshot: int, limit: int) -> dict:
    from compress.eval.harness import run_mmlu
    from compress.eval.lm_backend import CompressLM

    return run_mmlu(CompressLM(model, cache=False), num_fewshot, limit)


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--limit", type=int, default=5, show_default=True, help="questions per subject")
@click.option("--num-fewshot", type=int, default=0, show_default=True)
@click.option("--concurrency", type=int, default=16, show_default=True, help="lm-eval's num_concurrent")
def main(model, limit, num_fewshot, concurrency):
    timings, results = {}, {}
    for name, fn in (("local-completions via compress serve", lambda: served_mmlu(model, num_fewshot, limit, concurrency)),
                     ("compress backend, in process", lambda: direct_mmlu(model, num_fewshot, limit))):
        start = time.perf_counter()
        results[name] = fn()
        timings[name] = time.perf_counter() - start
    print("| lm-eval model | questions | MMLU acc | wall s |")
    print("|---|---:|---:|---:|")
    for name, res in results.items():
        print(f"| {name} | {res['all']['n']} | {100 * res['all']['acc']:.2f} | {timings[name]:.0f} |")
    a, b = (r["subjects"] for r in results.values())
    differing = [s for s in a if abs(a[s]["acc"] - b[s]["acc"]) > 1e-9]
    print(json.dumps({"subjects": len(a), "subjects_with_different_accuracy": differing}))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
