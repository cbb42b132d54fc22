"""The CPU one-call decode step against the module path, interleaved in one process.

    OMP_NUM_THREADS=2 python -m compress.bench.decode_step MODEL [--batch 1] [--prompt-len 64] [--new-tokens 16]
        [--repeats 3] [--cpu-lm-head int8] [--cpu-int8-activations]

MODEL: a model the step runs (4-bit or fp32 Linears; docs/runtime.md, "A decode step in one C call").
Generates the same greedy requests with ``runner.decode_step`` set and unset, alternating, and prints the
fastest run of each (prompt included), their ratio and whether the tokens are the same.
"""

import time

import click

from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams


class Counted:
    """A DecodeStep that counts the steps it ran (the runner takes it only where C was chosen for every op)."""

    def __init__(self, step):
        self.step, self.calls = step, 0

    def takes(self, *args) -> bool:
        return self.step.takes(*args)

    def __call__(self, *args):
        self.calls += 1
        return self.step(*args)


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - start, [o.token_ids for o in outs]


@click.command()
@click.argument("model")
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--prompt-len", type=int, default=64, show_default=True)
@click.option("--new-tokens", type=int, default=16, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option("--cpu-lm-head", type=click.Choice(["stored", "int8"]), default="stored", show_default=True)
@click.option("--cpu-int8-activations", is_flag=True)
def main(model, batch, prompt_len, new_tokens, repeats, cpu_lm_head, cpu_int8_activations):
    llm = LLM(model, cpu_lm_head=cpu_lm_head, cpu_int8_activations=cpu_int8_activations)
    step = llm.runner.decode_step
    if step is not None:
        step = Counted(step)
    if step is None:
        raise click.UsageError(f"{model} does not run the one-call decode step here (docs/runtime.md, 'A decode step in one C call')")
    prompts = [[1000 + 7 * i + j for j in range(prompt_len)] for i in range(batch)]
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    best, tokens = {}, {}
    for rep in range(repeats):
        for on in (True, False) if rep % 2 == 0 else (False, True):
            llm.runner.decode_step = step if on else None
            seconds, tokens[on] = timed(llm, prompts, params)
            best[on] = min(best.get(on, seconds), seconds)
    print(f"{model}: batch {batch}, {prompt_len}-token prompts + {new_tokens} tokens, fastest of {repeats}: "
          f"module path {best[False]:.2f} s, C step {best[True]:.2f} s, {best[False] / best[True]:.2f}x; "
          f"same tokens: {tokens[True] == tokens[False]}; the C step ran {step.calls} steps")


if __name__ == "__main__":
    main()
