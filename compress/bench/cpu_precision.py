"""What the CPU runtime's lossy options cost: WikiText-2 perplexity and greedy outputs with the lm_head held
as int8 (``--cpu-lm-head int8``) and int4 Linears on int8 activations (``--cpu-int8-activations``).

    python -m compress.bench.cpu_precision MODEL [--seq-len 512] [--limit-tokens 32768] [--max-tokens 32]

Perplexity runs the model with the engine's swapped Linears on their C kernels at every row count, so
each option's arithmetic is what is measured (torch's path of an int4 Linear has fp32 activations).
Greedy outputs come from the engine (``LLM``) on the README's prompts.
"""

import time

import click
import torch

from compress import models
from compress.bench.cpu_kernels import host
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.runtime.cpu_linears import cpu_linears
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams

VARIANTS = {  # name -> (cpu_lm_head, cpu_int8_activations)
    "as stored": ("stored", False),
    "--cpu-lm-head int8": ("int8", False),
    "--cpu-int8-activations": ("stored", True),
    "both": ("int8", True),
}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def variant_perplexity(model_dir, lm_head: str, int8_activations: bool, tokens: torch.Tensor, cfg: PerplexityConfig) -> float:
    model = models.load_model(model_dir)
    for group in cpu_linears(model, lm_head, int8_activations).groups:
        for m in group.modules:
            m.use_c = [True]
    return perplexity(model, tokens, cfg, desc=f"lm_head {lm_head}, int8 activations {int8_activations}")


def greedy(model_dir, lm_head: str, int8_activations: bool, max_tokens: int) -> list[str]:
    llm = LLM(model_dir, cpu_lm_head=lm_head, cpu_int8_activations=int8_activations, kv_cache_memory=64 << 20)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
    return [o.text for o in outs]


@click.command()
@click.argument("model")
@click.option("--seq-len", type=int, default=512, show_default=True)
@click.option("--limit-tokens", type=int, default=32768, show_default=True)
@click.option("--max-tokens", type=int, default=32, show_default=True, help="greedy tokens per README prompt")
def main(model, seq_len, limit_tokens, max_tokens):
    start = time.time()
    model_dir = models.resolve(model)
    cfg = PerplexityConfig(seq_len=seq_len, limit_tokens=limit_tokens)
    tokens = wikitext_tokens(models.load_tokenizer(model_dir))
    print(host())
    rows, base_ppl, base_text = [], None, None
    for name, (lm_head, act) in VARIANTS.items():
        ppl = variant_perplexity(model_dir, lm_head, act, tokens, cfg)
        text = greedy(model_dir, lm_head, act, max_tokens)
        base_ppl, base_text = base_ppl or ppl, base_text or text
        same = sum(a == b for a, b in zip(text, base_text))
        rows.append(f"| {name} | {ppl:.4f} | {100 * (ppl / base_ppl - 1):+.2f} % | {same}/{len(PROMPTS)} |")
        for prompt, a, b in zip(PROMPTS, text, base_text):
            if a != b:
                print(f"{name}: {prompt!r} -> {a!r} (as stored: {b!r})")
    print(f"WikiText-2 perplexity, first {limit_tokens} tokens in windows of {seq_len}, C kernels at every row count; "
          f"greedy outputs of {max_tokens} tokens equal to the stored model's")
    print("| CPU option | perplexity | change | greedy outputs unchanged |\n|---|---:|---:|---:|")
    print("\n".join(rows))
    print(f"({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
