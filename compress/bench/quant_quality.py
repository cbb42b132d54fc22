"""The quantization table of docs/results/quality.md: fp32 vs RTN vs AWQ at int4 and int3 on one model.

    python -m compress.bench.quant_quality --model smollm2-135m --out bench-out [--limit-tokens N]

Quantizes with each method (default calibration: 128 x 512 C4 tokens), measures wall time,
output size and WikiText-2 perplexity (2048-token windows), and prints a markdown table with
each method's perplexity gap to fp32 and AWQ's gap as a fraction of RTN's.
"""

import time
from pathlib import Path

import click

from compress import models
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.commands.evaluate import model_bytes
from compress.quant.config import QuantConfig
from compress.commands.quantize import run_quantize

RUNS = (("rtn", 4), ("awq", 4), ("rtn", 3), ("awq", 3))


def size_mib(path: Path) -> float:
    return model_bytes(path) / 2**20


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--out", default="bench-out", show_default=True)
@click.option("--limit-tokens", type=int, default=None, help="perplexity on the first N tokens only")
@click.option("--group-size", type=int, default=None)
def main(model, out, limit_tokens, group_size):
    src = models.resolve(model)
    tokens = wikitext_tokens(models.load_tokenizer(src))
    pcfg = PerplexityConfig(seq_len=2048, limit_tokens=limit_tokens)
    rows = [("fp32", "-", size_mib(src), perplexity(models.load_model(src), tokens, pcfg, desc="fp32"))]
    for method, bits in RUNS:
        dest = Path(out) / f"{method}-int{bits}"
        start = time.perf_counter()
        run_quantize(model, QuantConfig(method=method, bits=bits, group_size=group_size), str(dest), force=True)
        seconds = time.perf_counter() - start
        ppl = perplexity(models.load_model(dest), tokens, pcfg, desc=f"{method} int{bits}")
        rows.append((f"{method} int{bits}", f"{seconds:.0f}", size_mib(dest), ppl))
        print(f"done: {rows[-1]}", flush=True)  # a long run shows what it has so far
    base = rows[0][3]
    gaps = {name: ppl - base for name, _, _, ppl in rows}
    print(f"\nWikiText-2 test, 2048-token windows, {'first ' + str(limit_tokens) + ' tokens' if limit_tokens else 'all tokens'}")
    print("| model | quantize s | weights MiB | ppl | gap to fp32 | AWQ gap / RTN gap |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, secs, mib, ppl in rows:
        ratio = ""
        if name.startswith("awq"):
            ratio = f"{gaps[name] / gaps[name.replace('awq', 'rtn')]:.2f}"
        print(f"| {name} | {secs} | {mib:.1f} | {ppl:.3f} | {ppl - base:+.3f} | {ratio} |")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
