"""Peak memory and wall time of the real CLI on random-weight bf16 checkpoints of real shapes.

    python -m compress.bench.scale_bench --shape llama3-8b --shape tinyllama-1.1b \\
        [--steps write,hf-load,rtn,awq,awq-blocks,generate,eval] [--skip awq] [--work DIR] [--out FILE.md]
    python -m compress.bench.scale_bench --dry-run     # the tiny shape, every step, a temp dir, < 1 min

For each shape it writes (or reuses) WORK/SHAPE/src with compress.bench.random_checkpoint, then
runs each step as its own process under `/usr/bin/time -v` with HF_HUB_OFFLINE=1:
  write     python -m compress.bench.random_checkpoint SHAPE SRC      ("reused" when complete)
  hf-load   transformers' AutoModelForCausalLM.from_pretrained(SRC, dtype="auto") and one token through
            it: the baseline that llm-compressor and AutoAWQ start from (the whole model in memory)
  rtn       compress quantize SRC --method rtn --bits 4 -o WORK/SHAPE/rtn --force
  awq       compress quantize SRC --method awq --bits 4 --calib-samples 4 --calib-seq-len 64 -o .../awq --force
  awq-blocks  python -m compress.bench.first_blocks SRC --method awq --blocks 2: the default calibration
            (128 x 512 tokens) on the first two blocks, and the whole model's time extrapolated
  generate  compress generate OUT "Hello" --max-tokens 16     (OUT: this run's RTN output, else SRC)
  eval      compress eval SRC --tasks wikitext --limit-tokens 2048 --seq-len 2048
and prints a markdown table (peak RSS, wall time, bytes in and out) under a header naming the
host. A failed step is a row with its exit status and the last line of its stderr. AWQ on 8B
takes hours on CPU: pass --skip awq and keep awq-blocks. Logs and the
`time -v` reports are kept in WORK/SHAPE/logs/.
"""

import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from compress import host, models
from compress.bench.random_checkpoint import SHAPES, SHARD_BYTES, hf_config, is_complete

STEPS = ("write", "hf-load", "rtn", "awq", "awq-blocks", "generate", "eval")
# The baseline: transformers loading the checkpoint as stored (what llm-compressor and AutoAWQ start from) and
# running one token through it: its weights are memory-mapped, so they count in RSS once a forward touches them.
HF_LOAD = ("import sys, torch; from transformers import AutoModelForCausalLM; "
           "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype='auto'); m(torch.tensor([[1]]))")
SPEED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
CLI = [sys.executable, "-m", "compress.cli"]
DRY_RUN_SHARD_BYTES = 4 * 2**20  # the tiny checkpoint then has several shards and an index
TIME = "/usr/bin/time"


@dataclass
class Row:
    shape: str
    step: str
    peak_bytes: int | None = None
    wall_s: float | None = None
    src_bytes: int | None = None
    out_bytes: int | None = None
    status: str = "ok"


def parse_time_v(text: str) -> tuple[int, float]:
    """(peak RSS bytes, wall seconds) from GNU time -v's report."""
    rss = re.search(r"Maximum resident set size \(kbytes\):\s*(\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\):\s*([\d:.]+)", text)
    if not rss or not wall:
        raise ValueError("not a /usr/bin/time -v report")
    seconds = 0.0
    for part in wall.group(1).split(":"):  # h:mm:ss or m:ss.ss
        seconds = seconds * 60 + float(part)
    return int(rss.group(1)) * 1024, seconds


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in re.split(r"[\r\n]", text) if ln.strip()]
    return lines[-1] if lines else ""


def weights_bytes(path: Path) -> int | None:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else None


def bench_env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    env.setdefault("COMPRESS_DATA_DIR", str(Path(models.__file__).resolve().parents[1].parent / "shared" / "data"))
    return env


def run_timed(argv: list[str], logs: Path, name: str) -> tuple[int, int | None, float | None, str, str]:
    """Run argv under /usr/bin/time -v: (exit status, peak RSS bytes, wall s, last stderr line, last stdout line)."""
    logs.mkdir(parents=True, exist_ok=True)
    report, out, err = (logs / f"{name}.{ext}" for ext in ("time", "out", "err"))
    print(f"$ {shlex.join(argv)}   (logs: {logs}/{name}.*)", flush=True)
    with open(out, "w") as fo, open(err, "w") as fe:
        rc = subprocess.call([TIME, "-v", "-o", str(report), *argv], stdout=fo, stderr=fe, env=bench_env())
    try:
        peak, wall = parse_time_v(report.read_text())
    except (OSError, ValueError):
        peak, wall = None, None
    return rc, peak, wall, last_line(err.read_text(errors="replace")), last_line(out.read_text(errors="replace"))


def step_argv(step: str, shape: str, src: Path, work: Path, shard_bytes: int, gen_model: Path) -> tuple[list[str], Path | None]:
    """The command of one step and the directory it writes (None: it writes nothing)."""
    if step == "write":
        return [sys.executable, "-m", "compress.bench.random_checkpoint", shape, str(src),
                "--shard-bytes", str(shard_bytes)], None
    if step == "hf-load":
        return [sys.executable, "-c", HF_LOAD, str(src)], None
    if step == "awq-blocks":
        return [sys.executable, "-m", "compress.bench.first_blocks", str(src), "--method", "awq", "--blocks", "2"], None
    if step in ("rtn", "awq"):
        calib = ["--calib-samples", "4", "--calib-seq-len", "64"] if step == "awq" else []
        out = work / step
        return [*CLI, "quantize", str(src), "--method", step, "--bits", "4", *calib, "-o", str(out), "--force"], out
    if step == "generate":
        return [*CLI, "generate", str(gen_model), "Hello", "--max-tokens", "16"], None
    if step == "eval":
        return [*CLI, "eval", str(src), "--tasks", "wikitext", "--limit-tokens", "2048", "--seq-len", "2048"], None
    raise ValueError(step)


def bench_shape(shape: str, steps: list[str], work: Path, shard_bytes: int) -> list[Row]:
    """Every requested step on one shape, in order; a failure is a row, never an exception."""
    work, rows = work / shape, []
    src = work / "src"
    gen_model = src
    for step in steps:
        if step == "write" and is_complete(src, hf_config(SHAPES[shape], torch.bfloat16, models.resolve(models.DEFAULT_MODEL))):
            rows.append(Row(shape, step, src_bytes=weights_bytes(src), status="reused"))
            continue
        argv, out = step_argv(step, shape, src, work, shard_bytes, gen_model)
        rc, peak, wall, err, said = run_timed(argv, work / "logs", step)
        row = Row(shape, step if step != "generate" else f"generate ({gen_model.name})", peak, wall,
                  weights_bytes(src), weights_bytes(out) if out and rc == 0 else None)
        if rc != 0:
            row.status = f"failed (exit {rc}): {err}"
        elif step == "rtn":
            gen_model = out
        elif step == "awq-blocks":
            row.status = f"ok: {said}"
        rows.append(row)
        print(format_row(row), flush=True)
    return rows


def cpu_info() -> tuple[str, list[str]]:
    present = host.cpu_flags()
    return host.cpu_model(), [f for f in SPEED_FLAGS if f in present]


def header(argv: list[str]) -> str:
    cpu, flags = cpu_info()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return "\n".join([
        f"## scale bench, {datetime.datetime.now().isoformat(timespec='seconds')}",
        "",
        f"- command: `{shlex.join(argv)}`",
        f"- host: {cpu}, {cores} cores, {ram:.0f} GiB RAM; flags: {' '.join(flags) or 'none of ' + ', '.join(SPEED_FLAGS)}",
        f"- torch {torch.__version__}, python {platform.python_version()}, {torch.get_num_threads()} torch threads",
        "- random bf16 weights, SmolLM2 tokenizer (vocab 49152); peak RSS and wall time from `/usr/bin/time -v`",
        "",
    ]) + "\n"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def format_row(r: Row) -> str:
    peak = f"{r.peak_bytes / 2**30:.2f}" if r.peak_bytes is not None else "-"
    wall = f"{r.wall_s:.1f}" if r.wall_s is not None else "-"
    ratio = f"{r.src_bytes / r.out_bytes:.2f}x" if r.src_bytes and r.out_bytes else "-"
    cells = [r.shape, r.step, peak, wall, fmt_bytes(r.src_bytes), fmt_bytes(r.out_bytes), ratio, r.status.replace("|", "/")]
    return "| " + " | ".join(cells) + " |"


def format_table(rows: list[Row]) -> str:
    lines = ["| shape | step | peak RSS GiB | wall s | source bytes | output bytes | ratio | status |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    return "\n".join(lines + [format_row(r) for r in rows])


def parse_steps(steps: str, skip: tuple[str, ...]) -> list[str]:
    chosen = [s.strip() for s in steps.split(",") if s.strip()]
    unknown = [s for s in chosen + list(skip) if s not in STEPS]
    if unknown:
        raise click.BadParameter(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(STEPS)}")
    if "write" not in chosen:
        chosen.insert(0, "write")  # every other step needs the checkpoint (reused when complete)
    return [s for s in STEPS if s in chosen and s not in skip]


def run_bench(shapes: list[str], steps: list[str], work: Path, shard_bytes: int, out: Path | None, argv: list[str]) -> str:
    if not Path(TIME).is_file():
        raise click.ClickException(f"{TIME} not found; install GNU time (apt-get install time)")
    rows = [row for shape in shapes for row in bench_shape(shape, steps, work, shard_bytes)]
    report = header(argv) + format_table(rows) + "\n"
    print("\n" + report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
        print(f"written to {out}")
    return report


@click.command()
@click.option("--shape", "shapes", multiple=True, type=click.Choice(sorted(SHAPES)),
              help="repeatable [default: llama3-8b]")
@click.option("--steps", default=",".join(STEPS), show_default=True,
              help="comma-separated subset, run in the order shown; write is added (it reuses a complete checkpoint)")
@click.option("--skip", multiple=True, type=click.Choice(STEPS), help="drop a step (repeatable), e.g. --skip awq")
@click.option("--work", type=click.Path(file_okay=False), default=None,
              help="checkpoints, outputs and logs [default: $COMPRESS_CACHE/scale-bench]")
@click.option("--shard-bytes", type=int, default=None, help="source shard size [default: 2e9; dry run: 4 MiB]")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="also write the report to this .md file")
@click.option("--dry-run", is_flag=True, help="the tiny shape, every step, in a temporary work dir")
def main(shapes, steps, skip, work, shard_bytes, out, dry_run):
    """Peak RSS and wall time of quantize/generate/eval on random-weight checkpoints of real shapes."""
    argv = ["python", "-m", "compress.bench.scale_bench", *sys.argv[1:]]
    chosen = parse_steps(steps, skip)
    out = Path(out) if out else None
    if dry_run:
        with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
            run_bench(["tiny"], chosen, Path(tmp), shard_bytes or DRY_RUN_SHARD_BYTES, out, argv)
        return
    work = Path(work) if work else models.cache_dir() / "scale-bench"
    run_bench(list(shapes) or ["llama3-8b"], chosen, work, shard_bytes or SHARD_BYTES, out, argv)


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
