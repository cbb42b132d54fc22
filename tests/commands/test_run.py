"""`compress run` on a tiny model with tiny budgets: every stage runs once, reruns skip, changes rerun what they touch."""

import io
import json
import shutil
from contextlib import redirect_stdout

import pytest

from compress.recipe import load_recipe
from compress.commands.run import run_recipe
from tests.conftest import read_json

RECIPE = """\
model: {model}
prune:
  kind: prune-distill
  intermediate_size: 96
  importance: magnitude
  data: {text}
  tokens: 64
  seq_len: 16
  batch_size: 2
  eval_every: 1
  save_every: 1
quant:
  kind: quantize
  method: rtn
eval:
  kind: eval
  models: [quant]
  tasks: [wikitext]
  seq_len: 32
  limit_tokens: 64
"""
ALL_RUN = {"prune": "run", "quant": "run", "eval": "run"}
ALL_SKIP = {"prune": "skip", "quant": "skip", "eval": "skip"}


def run(recipe, out, *sets, start=None) -> dict[str, str]:
    """{stage: "run" | "skip"} from what `compress run` printed."""
    printed = io.StringIO()
    with redirect_stdout(printed):
        run_recipe(load_recipe(recipe, sets=sets), out, start)
    lines = printed.getvalue().splitlines()
    return {line.split()[1]: line.split()[0] for line in lines if line.startswith(("run ", "skip "))}


@pytest.fixture(scope="module")
def first(tmp_path_factory, tiny_dir, data_dir):
    """(recipe, OUT, what the first run did): one tiny pipeline run, copied by each test that changes it."""
    root = tmp_path_factory.mktemp("run")
    text = root / "text.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(200)))
    recipe = root / "tiny.yaml"
    recipe.write_text(RECIPE.format(model=tiny_dir, text=text))
    return recipe, root / "out", run(recipe, root / "out")


@pytest.fixture
def done(first, tmp_path):
    recipe, out, _ = first
    return recipe, shutil.copytree(out, tmp_path / "out")  # copy2 keeps mtimes, so nothing looks changed


def test_first_run_runs_every_stage_into_its_folder(first):
    recipe, out, did = first
    assert did == ALL_RUN
    assert {p.name for p in out.iterdir()} == {"prune", "quant", "eval"}  # no staging or checkpoint left behind
    assert {p.name for p in (out / "eval").iterdir()} == {"report.md", "report.json", "ppl_vs_bytes.png", "compress.json"}
    assert [r["model"] for r in read_json(out / "eval" / "report.json")["models"]] == ["quant"]
    run_info = read_json(out / "quant" / "compress.json")["run"]
    assert run_info["settings"]["inputs"] == ["prune"] and run_info["settings"]["quantize"]["method"] == "rtn"


def test_second_run_does_nothing(done):
    recipe, out = done
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert run(recipe, out) == ALL_SKIP
    assert stamps == {p: p.stat().st_mtime_ns for p in out.rglob("*")}


def test_a_changed_key_reruns_its_stage_and_the_later_ones(done):
    recipe, out = done
    assert run(recipe, out, "quant.bits=3") == {"prune": "skip", "quant": "run", "eval": "run"}
    assert read_json(out / "quant" / "compress.json")["recipe"]["quantize"]["bits"] == 3
    assert run(recipe, out, "quant.bits=3") == ALL_SKIP
    assert run(recipe, out, "quant.bits=3", "eval.limit_tokens=32") == {"prune": "skip", "quant": "skip", "eval": "run"}


def test_from_reruns_that_stage_and_the_later_ones(done):
    recipe, out = done
    assert run(recipe, out, start="quant") == {"prune": "skip", "quant": "run", "eval": "run"}
    assert run(recipe, out) == ALL_SKIP


def test_an_incomplete_stage_reruns(done):
    recipe, out = done
    next((out / "quant").glob("*.safetensors")).unlink()
    assert run(recipe, out)["quant"] == "run"
    doc = read_json(out / "eval" / "compress.json")
    del doc["run"]  # as when a run is killed between the stage's rename and its hash
    (out / "eval" / "compress.json").write_text(json.dumps(doc))
    assert run(recipe, out) == {"prune": "skip", "quant": "skip", "eval": "run"}
