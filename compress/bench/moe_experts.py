"""A mixture of experts decoding only its routed experts against the same model computing every expert, in one process.

    OMP_NUM_THREADS=2 python -m compress.bench.moe_experts MODEL [--batch 1] [--prompt-len 64] [--new-tokens 16] [--repeats 3]

MODEL: a MoE checkpoint (e.g. scale_bench's qwen3-30b-a3b-8l RTN export). The second engine state runs every
expert of every sparse layer on every token (``SparseMoe.calibrating``, what quantization's calibration does)
while the output stays routed: the cost of a decoder that does not skip unchosen experts. The runs alternate;
the fastest of each is kept. Decode tok/s counts the new tokens after the first (the prompt's step excluded),
and the greedy tokens of both states must be the same.
"""

import platform
import time

import click

from compress import host
from compress.model.moe import SparseMoe
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams

FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_flags() -> str:
    have = host.cpu_flags()
    return " ".join(f for f in FLAGS if f in have) if have else platform.processor()


def decode_rate(llm: LLM, prompts: list[list[int]], new_tokens: int) -> tuple[float, list[list[int]]]:
    """(decode tok/s over every sequence, tokens): one prefill-only run subtracted from a full run."""
    first = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    full = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, first)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    outs = llm.generate(prompts, full)
    total = time.perf_counter() - start
    return len(prompts) * (new_tokens - 1) / max(total - prefill, 1e-9), [o.token_ids for o in outs]


def set_all_experts(llm: LLM, on: bool) -> int:
    moes = [m for m in llm.runner.model.modules() if isinstance(m, SparseMoe)]
    for m in moes:
        m.calibrating = on
    return len(moes)


@click.command()
@click.argument("model")
@click.option("--batch", default=1, show_default=True)
@click.option("--prompt-len", default=64, show_default=True)
@click.option("--new-tokens", default=16, show_default=True)
@click.option("--repeats", default=3, show_default=True)
def main(model, batch, prompt_len, new_tokens, repeats):
    llm = LLM(model, max_num_seqs=max(batch, 1), enable_prefix_caching=False)  # each run computes its prompt again
    if not set_all_experts(llm, False):
        raise click.UsageError(f"{model} has no sparse (MoE) layers")
    prompts = [[(7 * i + 13 * j) % 1000 + 10 for j in range(prompt_len)] for i in range(batch)]
    best = {"routed": 0.0, "every expert": 0.0}
    tokens = {}
    for _ in range(repeats):
        for name in best:
            set_all_experts(llm, name == "every expert")
            rate, tokens[name] = decode_rate(llm, prompts, new_tokens)
            best[name] = max(best[name], rate)
    print(f"host: {platform.processor() or platform.machine()}; flags: {cpu_flags()}; batch {batch}, prompt {prompt_len}, "
          f"{new_tokens} new tokens, best of {repeats}")
    print("| experts computed | decode tok/s |\n|---|---:|")
    for name, rate in best.items():
        print(f"| {name} | {rate:.2f} |")
    print(f"routed / every expert: {best['routed'] / best['every expert']:.2f}x; same tokens: {tokens['routed'] == tokens['every expert']}")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
