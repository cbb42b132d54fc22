"""The quantization table of docs/results/quality.md: fp32 vs RTN vs AWQ (and AutoRound) at int4 and int3, per model.

    python -m compress.bench.quant_quality --out bench-out [--model smollm2-135m --model smollm2-135m-offgrid]
        [--limit-tokens N] [--bits 4] [--methods rtn,awq] [--tune 50 ...] [--autoround 200x128x512 ...] [--reuse]

Quantizes each model with each method (default calibration: 128 x 512 C4 tokens), measures wall time,
output size and WikiText-2 perplexity (2048-token windows), and prints one markdown table: each method's
perplexity gap to the model's own fp32 and its gap as a fraction of RTN's at the same bits. The default
models are the built-in SmolLM2 (its weights on a Q4_1 grid) and its off-grid copy (`make offgrid`).
``--autoround ITERSxSAMPLESxSEQLEN`` adds Intel AutoRound (its own venv, docs/autoround.md) in our format (the
same bits and group size, asymmetric) on our calibration rows, written as its dequantized "fake" checkpoint (bf16:
its size is not the format's, so the table leaves it out).
"""

import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import click

from compress import models
from compress.commands.evaluate import model_bytes
from compress.commands.quantize import run_quantize
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.quant.apply import resolve_group_size
from compress.quant.config import QuantConfig

MODELS = ("smollm2-135m", "smollm2-135m-offgrid")
METHODS = ("rtn", "awq")
BITS = (4, 3)


@dataclass(frozen=True)
class AutoRoundRun:
    """One AutoRound setting: optimisation steps per block, calibration rows and their length."""
    iters: int
    nsamples: int
    seqlen: int

    @classmethod
    def parse(cls, text: str) -> "AutoRoundRun":
        parts = text.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or int(parts[1]) < 1 or int(parts[2]) < 2:
            raise click.BadParameter(f"{text!r}: give ITERSxSAMPLESxSEQLEN, e.g. 200x128x512", param_hint="--autoround")
        return cls(*map(int, parts))

    def label(self, bits: int) -> str:
        return f"autoround int{bits} ({self.iters} iters, {self.nsamples}x{self.seqlen})"

    def dirname(self, bits: int) -> str:
        return f"autoround-int{bits}-i{self.iters}-n{self.nsamples}-s{self.seqlen}"


def size_mib(path: Path) -> float:
    return model_bytes(path) / 2**20


def ours(model: str, dest: Path, method: str, bits: int, group_size: int | None, tune_iters: int = 0) -> tuple[Path, float]:
    start = time.perf_counter()
    run_quantize(model, QuantConfig(method=method, bits=bits, group_size=group_size, tune_iters=tune_iters), str(dest), force=True)
    return dest, time.perf_counter() - start


def autoround(src: Path, tokenizer, dest: Path, run: AutoRoundRun, bits: int, group_size: int) -> tuple[Path, float]:
    """AutoRound in our format (bits, group size, asymmetric) on our calibration rows; (its checkpoint, seconds)."""
    from compress.bench import autoround as ar

    calib = ar.calibration_file(tokenizer, dest.parent / f"{dest.name}.jsonl", run.nsamples, run.seqlen)
    scheme = ("--bits", str(bits), "--group_size", str(group_size), "--asym")
    return ar.run_autoround(src, dest, "fake", run.iters, run.nsamples, run.seqlen, calib, scheme)


def made(dest: Path, make, reuse: bool) -> tuple[Path, float]:
    """``make()`` -> (checkpoint, seconds), remembered in DEST.json; with ``reuse`` an earlier run's is kept."""
    record = dest.parent / f"{dest.name}.json"
    if reuse and record.is_file():
        done = json.loads(record.read_text())
        return Path(done["path"]), done["seconds"]
    path, seconds = make()
    record.write_text(json.dumps({"path": str(path), "seconds": seconds}))
    return path, seconds


def bits_jobs(model: str, out: Path, bits: int, methods: list[str], tunes: list[int], group_size: int | None) -> list:
    """Our rows at ``bits``: (name, checkpoint directory under ``out``, what makes it, whether its size is the
    format's), for each method and for AWQ with each count of tuning steps."""
    jobs = [(f"{m} int{bits}", out / f"{m}-int{bits}", partial(ours, model, method=m, bits=bits, group_size=group_size), True)
            for m in methods]
    return jobs + [(f"awq int{bits} + {n} tuning steps", out / f"awq-tune{n}-int{bits}",
                    partial(ours, model, method="awq", bits=bits, group_size=group_size, tune_iters=n), True) for n in tunes]


def measure(model: str, out: Path, pcfg: PerplexityConfig, group_size: int | None, methods: list[str],
            bits_list: list[int], ar_runs: list[AutoRoundRun], reuse: bool, tunes: list[int] = ()) -> list[dict]:
    """fp32, then per bits each method, AWQ with each count of tuning steps and each AutoRound run: model, name, bits,
    quantize seconds (None for fp32), MiB, perplexity."""
    src = models.resolve(model)
    tokenizer = models.load_tokenizer(src)
    tokens = wikitext_tokens(tokenizer)
    fp32 = models.load_model(src)
    rows = [{"model": model, "name": "fp32", "bits": None, "seconds": None, "mib": size_mib(src),
             "ppl": perplexity(fp32, tokens, pcfg, desc=f"{model} fp32")}]
    # AutoRound's --group_size: the one our quantizer picks for this model (QuantConfig's None)
    ar_group = group_size or resolve_group_size(fp32, None)
    del fp32
    (out / model).mkdir(parents=True, exist_ok=True)
    for bits in bits_list:
        jobs = bits_jobs(model, out / model, bits, methods, tunes, group_size)
        jobs += [(r.label(bits), out / model / r.dirname(bits),
                  partial(autoround, src, tokenizer, run=r, bits=bits, group_size=ar_group), False) for r in ar_runs]
        for name, dest, make, sized in jobs:
            path, seconds = made(dest, partial(make, dest), reuse)
            ppl = perplexity(models.load_model(path), tokens, pcfg, desc=f"{model} {name}")
            rows.append({"model": model, "name": name, "bits": bits, "seconds": seconds,
                         "mib": size_mib(path) if sized else None, "ppl": ppl})
            print(f"done: {rows[-1]}", flush=True)  # a long run shows what it has so far
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table; gaps to the fp32 row of the same model, each method's gap over RTN's at the same bits."""
    base = {r["model"]: r["ppl"] for r in rows if r["name"] == "fp32"}
    rtn = {(r["model"], r["bits"]): r["ppl"] - base[r["model"]] for r in rows if r["name"].startswith("rtn")}
    lines = ["| model | method | quantize s | weights MiB | ppl | gap to fp32 | gap / RTN's |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        gap = r["ppl"] - base[r["model"]]
        rtn_gap = rtn.get((r["model"], r["bits"]))
        ratio = "" if r["bits"] is None or r["name"].startswith("rtn") or rtn_gap is None else f"**{gap / rtn_gap:.2f}**"
        secs = "-" if r["seconds"] is None else f"{r['seconds']:.0f}"
        mib = "-" if r["mib"] is None else f"{r['mib']:.1f}"
        lines.append(f"| {r['model']} | {r['name']} | {secs} | {mib} | {r['ppl']:.3f} | {gap:+.3f} | {ratio} |")
    return "\n".join(lines)


@click.command()
@click.option("--model", "model_names", multiple=True, help=f"repeatable [default: {', '.join(MODELS)}]")
@click.option("--out", default="bench-out", show_default=True)
@click.option("--limit-tokens", type=int, default=None, help="perplexity on the first N tokens only")
@click.option("--group-size", type=int, default=None)
@click.option("--bits", "bits_list", type=click.Choice(["4", "3"]), multiple=True, help="repeatable [default: 4, 3]")
@click.option("--methods", default=",".join(METHODS), show_default=True, help="ours, comma-separated (rtn gives the ratios)")
@click.option("--autoround", "ar_runs", multiple=True, metavar="ITERSxSAMPLESxSEQLEN",
              help="repeatable: also AutoRound at this setting (e.g. 200x128x512; docs/autoround.md)")
@click.option("--tune", "tunes", type=click.IntRange(min=1), multiple=True, metavar="N",
              help="repeatable: also AWQ with N block-output tuning steps (quantize --tune-iters N)")
@click.option("--reuse", is_flag=True, help="keep the checkpoints (and seconds) an earlier run wrote under --out")
def main(model_names, out, limit_tokens, group_size, bits_list, methods, ar_runs, tunes, reuse):
    pcfg = PerplexityConfig(seq_len=2048, limit_tokens=limit_tokens)
    names = list(model_names) or list(MODELS)
    method_list = [m.strip() for m in methods.split(",") if m.strip()]
    if not set(method_list) <= set(METHODS):
        raise click.BadParameter(f"{methods!r}: give some of {', '.join(METHODS)}", param_hint="--methods")
    runs = [AutoRoundRun.parse(text) for text in ar_runs]
    if runs:
        from compress.bench.autoround import autoround_python

        autoround_python()  # a missing venv fails before the first hour of work
    for name in names:
        models.resolve(name)  # a missing model fails before the first hour of work
    bits = [int(b) for b in bits_list] or list(BITS)
    rows = [row for name in names
            for row in measure(name, Path(out), pcfg, group_size, method_list, bits, runs, reuse, list(tunes))]
    print(f"\nWikiText-2 test, 2048-token windows, {'first ' + str(limit_tokens) + ' tokens' if limit_tokens else 'all tokens'}")
    print(table(rows))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
