"""`compress run`: a recipe's stages in order, each into OUT/STAGE/, skipping the ones that are up to date.

A stage is up to date when OUT/STAGE/compress.json exists, every file it lists is there, and its
`run.inputs_hash` equals the hash of the stage's resolved settings and the identities of the
models it reads. Outputs are staged and renamed into place (compress/outdir.py), so a folder with
a compress.json is complete; the hash is merged in last, so an interrupted stage reruns.
"""

import hashlib
import json
import time
from pathlib import Path

from compress import models, outdir
from compress.errors import UserError
from compress.manifest import MANIFEST, read_manifest, save_manifest, write_manifest
from compress.recipe import MODEL, Recipe, Stage


def identity(model_dir: Path) -> dict:
    """What a model is, cheaply: the per-file sha256 of its compress.json, else each file's size and mtime.

    compress.json itself is left out: `compress eval` merges its numbers into it.
    """
    doc = read_manifest(model_dir) or {}
    if doc.get("sha256"):
        return {"sha256": doc["sha256"]}
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(Path(model_dir).iterdir()) if p.is_file() and p.name != MANIFEST}


def inputs_hash(stage: Stage, paths: dict[str, Path]) -> str:
    doc = {"stage": stage.section(), "inputs": {ref: identity(paths[ref]) for ref in stage.inputs}}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def up_to_date(dest: Path, digest: str) -> bool:
    doc = read_manifest(dest)
    if doc is None or doc.get("run", {}).get("inputs_hash") != digest:
        return False
    return all((dest / name).is_file() for name in doc.get("sha256", {}))


def mark_done(dest: Path, stage: Stage, digest: str, seconds: float) -> None:
    """Merge what ran into the stage's compress.json (written here for an eval stage, which has none)."""
    run = {"stage": stage.name, "inputs_hash": digest, "settings": stage.section(), "seconds": round(seconds, 1)}
    doc = read_manifest(dest)
    if doc is None:
        write_manifest(dest, run=run)
        return
    doc["run"] = run
    save_manifest(dest, doc)


def check_inputs(recipe: Recipe, model_dir: Path) -> None:
    """Fail on missing data or a quantized input model before the first stage starts."""
    from compress.calib import C4
    from compress.data import data_file
    from compress.commands.evaluate import check_data

    for stage in recipe.stages:
        if stage.kind == "eval":
            checked(stage, "tasks", check_data, stage.configs["eval"])
            continue
        if MODEL in stage.inputs and models.is_quantized(model_dir):
            raise UserError(f"{stage.at('input')}: {recipe.model} is quantized; {stage.kind} needs an unquantized model")
        for key, path in data_paths(stage):
            if path is None:
                checked(stage, key, data_file, C4)
            elif not Path(path).expanduser().exists():
                raise UserError(f"{stage.at(key)}: {path} not found")


def checked(stage: Stage, key: str, check, arg) -> None:
    try:
        check(arg)
    except UserError as e:
        raise UserError(f"{stage.at(key)}: {e}") from None


def data_paths(stage: Stage) -> list[tuple[str, str | None]]:
    """(key, path) of the text a model stage reads; None is the default C4 file."""
    prune, distill, quant = (stage.configs.get(k) for k in ("prune", "distill", "quantize"))
    paths = [("calib_data", prune.calib_data)] if prune and prune.importance == "activation" else []
    paths += [("data", distill.data)] if distill else []
    return paths + ([("calib_data", quant.calib_data)] if quant and quant.needs_calibration else [])


def run_stage(stage: Stage, sources: dict[str, str], paths: dict[str, Path], dest: Path) -> None:
    if stage.kind == "prune-distill":
        from compress.commands.prune_distill import run_prune_distill

        run_prune_distill(sources[stage.inputs[0]], stage.configs["prune"], stage.configs["distill"], str(dest), force=True)
    elif stage.kind == "quantize":
        from compress.commands.quantize import run_quantize

        run_quantize(sources[stage.inputs[0]], stage.configs["quantize"], str(dest), force=True)
    else:
        from compress.eval.report import write_report
        from compress.commands.evaluate import evaluate_one, print_table

        cfg = stage.configs["eval"]
        labels = {MODEL: Path(sources[MODEL]).name}  # the input model by its name, stages by theirs
        rows = [evaluate_one(labels.get(ref, ref), paths[ref], cfg) for ref in stage.inputs]
        print_table(rows)
        write_report(rows, cfg, dest)
        print(f"report written to {dest}/report.md")


def run_recipe(recipe: Recipe, out: str | Path, start: str | None = None) -> None:
    """Run every stage that is not up to date (all from ``start`` on); the last model is the one to serve."""
    outdir.check_writable(out)  # an empty or unwritable -o fails before any work
    out = Path(out).expanduser()
    if start is not None:
        recipe.stage(start)  # an unknown name fails before any work
    try:
        paths = {MODEL: models.resolve(recipe.model)}
    except UserError as e:
        raise UserError(f"{recipe.model_where}: {e}") from None
    sources = {MODEL: recipe.model}
    check_inputs(recipe, paths[MODEL])
    forced = False
    for stage in recipe.stages:
        forced = forced or stage.name == start
        dest = out / stage.name
        digest = inputs_hash(stage, paths)
        if not forced and up_to_date(dest, digest):
            print(f"skip {stage.name} (up to date)")
        else:
            print(f"run {stage.name} ({stage.kind})", flush=True)
            began = time.perf_counter()
            run_stage(stage, sources, paths, dest)
            mark_done(dest, stage, digest, time.perf_counter() - began)
            print(f"{stage.name} done in {time.perf_counter() - began:.0f} s: {dest}")
        if stage.kind != "eval":
            paths[stage.name] = dest
            sources[stage.name] = str(dest)
    served = [s.name for s in recipe.stages if s.kind != "eval"]
    if served:
        print(f"serve the last model: compress serve {out / served[-1]}")
