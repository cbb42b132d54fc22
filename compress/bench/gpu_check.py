"""Every GPU figure of issue 27 in one command for the lent H200 machine: <= 8 minutes, JSON + markdown.

    python -m compress.bench.gpu_check --out DIR [--work /tmp/compress-gpu-check] [--budget 470] [--phases a,b]
    python -m compress.bench.gpu_check --dry-run --out DIR        # CPU, Triton interpreter, tiny shapes, ~1 minute

The phases (compress/bench/gpu_phases.py; docs/gpu-check.md lists what each measures) run in the
order of BUDGETS, each in a process of its own stopped at the smaller of its budget and what is
left of --budget. A phase that fails, hangs or cannot run (a phase it NEEDS did not finish) is
recorded and the next one runs. DIR receives gpu_check.json (each phase's result, the figures,
each target's pass / fail), gpu_check.md (the same as tables) and gpu_check.log (each phase's
output); the models and per-phase files stay under --work.
"""

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from compress.bench import gpu_moe
from compress.bench.gpu_targets import PLANS, at_batch, evaluate, figures, targets

ROOT = Path(__file__).resolve().parents[2]  # the repository: tests/ and kernels/ live here
BUDGETS = dict(env=30, cuda_tests=60, kernels=120, moe=60, checkpoint=90, quantize=75, correctness=60, engine=150, hf_generate=60,
               llmcompressor=150)  # seconds, in run order
NEEDS = dict(quantize=("checkpoint",), correctness=("quantize",), engine=("quantize",), hf_generate=("checkpoint",))
TOTAL_S, DRY_TOTAL_S, DRY_PHASE_S = 470, 150, 60  # 470 s leaves the rest of 8 minutes to the start and the copies
MIN_PHASE_S = 10  # no phase is started with less time left
LOG_TAIL = 200_000  # characters of each phase's output kept in gpu_check.log


def run_phase(name: str, args, limit: float, env: dict) -> dict:
    """One phase in a process group of its own, the group killed at the limit; its result with status and times."""
    cmd = [sys.executable, "-m", "compress.bench.gpu_phases", name, "--work", str(args.work)]
    cmd += ["--dry-run"] * args.dry_run + (["--llmc-model", args.llmc_model] if args.llmc_model else [])
    doc_path, log_path = args.work / "phases" / f"{name}.json", args.work / "logs" / f"{name}.log"
    doc_path.unlink(missing_ok=True)
    start, rc = time.perf_counter(), None
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            pass
        finally:  # on the limit or an interrupt: the phase and whatever it started (pytest, a CLI)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    doc = json.loads(doc_path.read_text()) if doc_path.is_file() else {}
    if rc is None:
        doc |= dict(status="timeout", note=f"stopped at its {limit:.0f} s limit; figures are those it had saved")
    elif rc != 0 or "status" not in doc:
        doc |= dict(status="error", note=last_line(log_path.read_text(errors="replace")) or f"exit status {rc}")
    return doc | dict(wall_s=time.perf_counter() - start, limit_s=limit)


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def document(args, phases: dict) -> dict:
    plan = PLANS[args.dry_run]
    figs = figures(phases, plan)
    return dict(command=shlex.join(["python", "-m", "compress.bench.gpu_check", *args.argv]), dry_run=args.dry_run,
                date=args.started, plan=asdict(plan), phases=phases, figures=figs, targets=evaluate(figs, targets(plan)))


def run(args) -> dict:
    """The selected phases in order, the outputs written after each (a run stopped from outside keeps what it has)."""
    phases, deadline = {}, time.monotonic() + args.budget
    for sub in ("phases", "logs"):
        (args.work / sub).mkdir(parents=True, exist_ok=True)
    env = os.environ | dict(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env |= dict(TRITON_INTERPRET="1") if args.dry_run else {}
    for name in (n for n in BUDGETS if n in args.phases):
        left = deadline - time.monotonic()
        blocked = [n for n in NEEDS.get(name, ()) if n in phases and phases[n]["status"] != "ok"]
        if blocked:
            phases[name] = dict(status="skipped", note=f"needs {', '.join(blocked)}")
        elif left < MIN_PHASE_S:
            phases[name] = dict(status="skipped", note=f"{left:.0f} s of --budget left")
        else:
            print(f"[{name}] ...", flush=True)
            phases[name] = run_phase(name, args, min(DRY_PHASE_S if args.dry_run else BUDGETS[name], left), env)
        print(f"[{name}] {phases[name]['status']} {phases[name].get('note', '')}", flush=True)
        write_outputs(document(args, phases), args)
    return document(args, phases)


def number(value, unit: str = "") -> str:
    return "-" if value is None else f"{value:.3g}{unit}" if isinstance(value, float) else f"{value}{unit}"


def table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(map(str, r)) + " |" for r in rows), ""]


def markdown(doc: dict) -> str:
    p = doc["phases"]
    env, k, eng, hf, greedy, tests = (p.get(n, {}) for n in ("env", "kernels", "engine", "hf_generate", "correctness", "cuda_tests"))
    dry = " (DRY RUN: CPU, Triton interpreter, tiny shapes and model; the figures mean nothing)" if doc["dry_run"] else ""
    versions = ", ".join(f"{name} {v}" for name, v in (env.get("versions") or {}).items())
    out = [f"# GPU check{dry}", "", f"`{doc['command']}` at {doc['date']}", "",
           f"Host {env.get('host', '?')} ({env.get('cpus', '?')} CPUs), GPU {env.get('gpu', '?')}, CUDA {env.get('cuda')}, "
           f"Python {env.get('python', '?')}, {versions}", ""]
    out += table(["phase", "status", "seconds (limit)", "note"],
                 [[n, r["status"], f"{r.get('wall_s', 0):.0f} ({r.get('limit_s', 0):.0f})", r.get("note", "")] for n, r in p.items()])
    out += ["## Targets", ""] + table(["target", "measured", "wanted", "result"], [
        [t["target"], number(t["value"], t["unit"]), t["want"], t["status"].upper()] for t in doc["targets"]])
    if k.get("rows"):
        out += ["## Kernels against torch's bf16 matmul (attention: against SDPA on a dense cache)", "",
                f"Baselines: torch.matmul in bf16 on the same shapes; scaled_dot_product_attention (fp16) on the same keys and "
                f"values laid out densely. Peak bandwidth {number(k.get('peak_gbps'))} GB/s.", ""]
        out += table(["op", "model", "shape", "M", "ms", "baseline ms", "speed-up", "GB/s", "% peak", "max err / bound"],
                     [[r["op"], r["model"], r["shape"], r["M"], f"{r['ms']:.4f}", f"{r['bf16_ms']:.4f}", f"{r['bf16_ms'] / r['ms']:.2f}x",
                       f"{r['gbps']:.0f}", number(100 * r["gbps"] / k["peak_gbps"] if k.get("peak_gbps") else None),
                       f"{r['err']:.2g} / {r['bound']:.2g}{'' if r['match'] else ' OFF'}"] for r in k["rows"]])
    if eng.get("tables"):
        out += ["## Engine: compress bench bf16 --compare int4 --gpu h200", "", eng["tables"], ""]
    if hf.get("rows"):
        bf16 = (eng.get("rows") or [[]])[0]
        out += ["## transformers generate (static batches) on the same prompts", ""]
        out += table(["batch", "dtype", "transformers decode tok/s", "engine bf16 decode tok/s", "engine / transformers"],
                     [[r["batch"], r["dtype"], f"{r['decode_tok_s']:.1f}", number(at_batch(bf16, r["batch"]).get("decode_tok_s")),
                       number(at_batch(bf16, r["batch"])["decode_tok_s"] / r["decode_tok_s"] if at_batch(bf16, r["batch"]) else None, "x")]
                      for r in hf["rows"]])
    if greedy.get("results"):
        out += [f"## int4 greedy tokens: fused kernels vs reference path ({greedy['prompts']} prompts, {greedy['tokens']} tokens)", "",
                f"{greedy['equal']} equal, {greedy['near_ties']} part at a near tie (each token in the other's top 5). "
                f"{greedy['note']}", ""]
        out += table(["prompt", "equal", "first differing token", "near tie"],
                     [[n, r["equal"], number(r["diverge_at"]), number(r["near_tie"])] for n, r in enumerate(greedy["results"])])
    out += gpu_moe.markdown(p.get("moe", {}))
    if "tests" in tests:
        out += ["## CUDA tests", "", f"{tests['passed']} passed, {tests['failures']} failed, {tests['errors']} errors, "
                f"{tests['skipped']} skipped of {tests['tests']} in {', '.join(tests['files'])}", ""]
        out += [f"- FAILED {t}" for t in tests["failed"]]
    return "\n".join(out)


def write_outputs(doc: dict, args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=1, default=str))
    (args.out / "gpu_check.md").write_text(markdown(doc))
    with open(args.out / "gpu_check.log", "w") as log:
        for name, result in doc["phases"].items():
            path = args.work / "logs" / f"{name}.log"
            text = path.read_text(errors="replace") if path.is_file() else "(not run)\n"
            log.write(f"===== {name}: {result['status']} =====\n{text[-LOG_TAIL:]}\n")


def check_machine(parser, args) -> None:
    if importlib.util.find_spec("compress.kernels") is None:
        parser.error("compress.kernels is not importable: `pip install --no-deps --no-build-isolation -e .`, or link "
                     "compress/kernels -> ../kernels (docs/gpu-check.md)")
    if not args.dry_run:
        import torch

        if os.environ.get("TRITON_INTERPRET") or not torch.cuda.is_available():
            parser.error("the GPU run needs CUDA and TRITON_INTERPRET unset; on CPU use --dry-run")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="gets gpu_check.json, gpu_check.md and gpu_check.log")
    parser.add_argument("--work", type=Path, default=None, help="models and per-phase files [default: TMP/compress-gpu-check]")
    parser.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1, tiny shapes and a tiny model")
    parser.add_argument("--budget", type=float, default=None, help=f"seconds for all phases [default: {TOTAL_S}; dry run {DRY_TOTAL_S}]")
    parser.add_argument("--phases", default=",".join(BUDGETS), help="a comma-separated subset, run in the usual order")
    parser.add_argument("--llmc-model", default=None, help="llmcompressor phase: SmolLM2's GGUF (or another model)")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.phases = set(args.phases.split(","))
    if args.phases - set(BUDGETS):
        parser.error(f"unknown phases {', '.join(sorted(args.phases - set(BUDGETS)))}; choose from {', '.join(BUDGETS)}")
    args.budget = args.budget or (DRY_TOTAL_S if args.dry_run else TOTAL_S)
    args.work = (args.work or Path(tempfile.gettempdir()) / f"compress-gpu-check{'-dry' * args.dry_run}").resolve()
    args.out, args.started = args.out.resolve(), datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    check_machine(parser, args)
    print("\n" + markdown(run(args)))


if __name__ == "__main__":
    main()
