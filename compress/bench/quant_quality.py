"""The quantization table of docs/results/quality.md: fp32 vs RTN vs AWQ at int4 and int3, on each model given.

    python -m compress.bench.quant_quality --out bench-out [--model smollm2-135m --model smollm2-135m-offgrid]
        [--limit-tokens N]

Quantizes each model with each method (default calibration: 128 x 512 C4 tokens), measures wall time,
output size and WikiText-2 perplexity (2048-token windows), and prints one markdown table: each method's
perplexity gap to the model's own fp32 and AWQ's gap as a fraction of RTN's at the same bits. The default
models are the built-in SmolLM2 (its weights on a Q4_1 grid) and its off-grid copy (`make offgrid`).
"""

import time
from pathlib import Path

import click

from compress import models
from compress.commands.evaluate import model_bytes
from compress.commands.quantize import run_quantize
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.quant.config import QuantConfig

RUNS = (("rtn", 4), ("awq", 4), ("rtn", 3), ("awq", 3))
MODELS = ("smollm2-135m", "smollm2-135m-offgrid")


def size_mib(path: Path) -> float:
    return model_bytes(path) / 2**20


def measure(model: str, out: Path, pcfg: PerplexityConfig, group_size: int | None) -> list[dict]:
    """One row per method of RUNS (after fp32): model, name, quantize seconds (None for fp32), MiB, perplexity."""
    src = models.resolve(model)
    tokens = wikitext_tokens(models.load_tokenizer(src))
    rows = [{"model": model, "name": "fp32", "seconds": None, "mib": size_mib(src),
             "ppl": perplexity(models.load_model(src), tokens, pcfg, desc=f"{model} fp32")}]
    for method, bits in RUNS:
        dest = out / model / f"{method}-int{bits}"
        start = time.perf_counter()
        run_quantize(model, QuantConfig(method=method, bits=bits, group_size=group_size), str(dest), force=True)
        seconds = time.perf_counter() - start
        ppl = perplexity(models.load_model(dest), tokens, pcfg, desc=f"{model} {method} int{bits}")
        rows.append({"model": model, "name": f"{method} int{bits}", "seconds": seconds, "mib": size_mib(dest), "ppl": ppl})
        print(f"done: {rows[-1]}", flush=True)  # a long run shows what it has so far
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table; gaps to the fp32 row of the same model, AWQ's gap over RTN's at the same bits."""
    base = {r["model"]: r["ppl"] for r in rows if r["name"] == "fp32"}
    gaps = {(r["model"], r["name"]): r["ppl"] - base[r["model"]] for r in rows}
    lines = ["| model | method | quantize s | weights MiB | ppl | gap to fp32 | AWQ gap / RTN gap |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = ""
        if r["name"].startswith("awq"):
            ratio = f"**{gaps[(r['model'], r['name'])] / gaps[(r['model'], r['name'].replace('awq', 'rtn'))]:.2f}**"
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        lines.append(f"| {r['model']} | {r['name']} | {secs} | {r['mib']:.1f} | {r['ppl']:.3f} | "
                     f"{gaps[(r['model'], r['name'])]:+.3f} | {ratio} |")
    return "\n".join(lines)


@click.command()
@click.option("--model", "model_names", multiple=True, help=f"repeatable [default: {', '.join(MODELS)}]")
@click.option("--out", default="bench-out", show_default=True)
@click.option("--limit-tokens", type=int, default=None, help="perplexity on the first N tokens only")
@click.option("--group-size", type=int, default=None)
def main(model_names, out, limit_tokens, group_size):
    pcfg = PerplexityConfig(seq_len=2048, limit_tokens=limit_tokens)
    names = list(model_names) or list(MODELS)
    for name in names:
        models.resolve(name)  # a missing model fails before the first hour of work
    rows = [row for name in names for row in measure(name, Path(out), pcfg, group_size)]
    print(f"\nWikiText-2 test, 2048-token windows, {'first ' + str(limit_tokens) + ' tokens' if limit_tokens else 'all tokens'}")
    print(table(rows))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
