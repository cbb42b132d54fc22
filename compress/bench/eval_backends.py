"""Our lm-eval backend against lm-eval's HFLM on the same MMLU run: accuracy and wall time.

    python -m compress.bench.eval_backends --model smollm2-135m --num-fewshot 0 [--state bench.jsonl]

Both score the same requests (same prompts, same token ids). The run goes subject by subject and
scores each subject with both backends back to back, the first backend alternating, so that drift
in the machine's speed falls on both; the time of a backend is the sum of its subjects' times (the
models load once, outside them). With --state every finished (subject, backend) is appended to a
JSON-lines file and a rerun of the same command skips it, so the full test set (hours on a CPU)
can be run in pieces (with the same thread count, which the state records); the table covers the
subjects both backends have finished.
"""

import json
import time
from pathlib import Path

import click
import torch

from compress.errors import UserError
from compress.models import resolve

HF, OURS = "hf", "compress"


def read_state(path: Path | None, config: dict) -> list[dict]:
    """Finished rows of an earlier run of the same config. A line torn by a kill mid-write is dropped
    and the file rewritten without it, so that later rows are appended after whole lines."""
    if path is None or not path.exists():
        return []
    lines = path.read_text().splitlines()
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    if not parsed:  # empty, or only a torn header: nothing was finished
        path.unlink()
        return []
    if parsed[0] != {"config": config}:
        raise UserError(f"{path} holds another run (model, few-shot, limit, batch, threads or subjects differ): "
                        "rerun with its settings or pass a new --state file")
    if len(parsed) < len(lines):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in parsed))
        tmp.replace(path)
    return parsed[1:]


def append_row(path: Path | None, config: dict, row: dict) -> None:
    if path is None:
        return
    with path.open("a") as f:
        if f.tell() == 0:
            f.write(json.dumps({"config": config}) + "\n")
        f.write(json.dumps(row) + "\n")


def order(index: int) -> tuple[str, str]:
    return (HF, OURS) if index % 2 == 0 else (OURS, HF)


def table(rows: list[dict], model: str, num_fewshot: int, hf_name: str) -> str:
    """The comparison over the subjects both backends finished."""
    from compress.eval import mmlu

    done = {b: {r["subject"]: r for r in rows if r["backend"] == b} for b in (HF, OURS)}
    both = sorted(set(done[HF]) & set(done[OURS]))
    if not both:
        return "no subject has been scored by both backends yet"
    seconds = {b: sum(done[b][s]["seconds"] for s in both) for b in (HF, OURS)}
    results = {b: mmlu.summarize({s: done[b][s] for s in both}) for b in (HF, OURS)}
    names = {HF: hf_name, OURS: "compress"}
    lines = [f"MMLU {num_fewshot}-shot, {results[OURS]['all']['n']} questions in {len(both)} of "
             f"{len(mmlu.SUBJECTS)} subjects, {model}",
             "| backend | acc (micro) | acc (macro) | stem | humanities | social sciences | other | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for b in (HF, OURS):
        r = results[b]
        groups = " | ".join(f"{100 * r[g]['acc']:.2f}" if g in r else "-" for g in mmlu.GROUPS)
        lines.append(f"| {names[b]} | {100 * r['all']['acc']:.2f} | {100 * r['all']['acc_macro']:.2f} | {groups} | "
                     f"{seconds[b]:.0f} |")
    lines.append(f"accuracy difference {100 * (results[OURS]['all']['acc'] - results[HF]['all']['acc']):+.2f} points; "
                 f"wall time ours / hf = {seconds[OURS] / seconds[HF]:.2f}")
    return "\n".join(lines)


def make_backends(model_dir: Path, hf_batch_size: int) -> dict:
    from compress.eval.harness import make_lm
    from compress.eval.lm_backend import CompressLM

    return {HF: make_lm(HF, model_dir, hf_batch_size), OURS: CompressLM(str(model_dir), cache=False)}


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--num-fewshot", type=int, default=0, show_default=True)
@click.option("--limit", type=int, default=None, help="questions per subject [default: the full test set]")
@click.option("--subjects", default=None, help="comma-separated subjects [default: all 57]")
@click.option("--hf-batch-size", type=int, default=16, show_default=True)
@click.option("--state", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="JSON-lines file of finished subjects: a rerun resumes from it")
@click.option("--summary", is_flag=True, help="only print the table of what --state holds; score nothing")
def main(model, num_fewshot, limit, subjects, hf_batch_size, state, summary):
    from compress.eval import mmlu
    from compress.eval.harness import run_mmlu

    names = subjects.split(",") if subjects else list(mmlu.SUBJECTS)
    unknown = [s for s in names if s not in mmlu.SUBJECTS]
    if unknown:
        raise UserError(f"unknown MMLU subject {', '.join(unknown)}: see compress/eval/mmlu.py SUBJECTS")
    if summary and state is None:
        raise UserError("--summary prints what a --state file holds: pass --state")
    mmlu.mmlu_dir()  # a missing data dir fails here, in one line, before the models load
    config = {"model": model, "num_fewshot": num_fewshot, "limit": limit, "hf_batch_size": hf_batch_size,
              "threads": torch.get_num_threads(), "subjects": names}
    rows = read_state(state, config)
    finished = {(r["subject"], r["backend"]) for r in rows}
    todo = [] if summary else [(i, s) for i, s in enumerate(names) if any((s, b) not in finished for b in (HF, OURS))]
    backends = make_backends(resolve(model), hf_batch_size) if todo else {}
    for i, subject in todo:
        for backend in order(i):
            if (subject, backend) in finished:
                continue
            start = time.perf_counter()
            result = run_mmlu(backends[backend], num_fewshot, limit, [subject])["subjects"][subject]
            row = {"subject": subject, "backend": backend, "seconds": time.perf_counter() - start, **result}
            rows.append(row)
            append_row(state, config, row)
    print(table(rows, model, num_fewshot, f"hf (HFLM, batch {hf_batch_size})"))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
