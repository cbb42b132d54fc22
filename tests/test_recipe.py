"""Recipes: every shipped one validates; every bad one is one line naming the key and where it was written."""

import signal
import sys
from pathlib import Path

import pytest

from compress.cli import cli
from compress.program import run_command
from compress.recipe import load_recipe
from tests.conftest import save_hf, tiny_hf

RECIPES = Path(__file__).parents[1] / "recipes"
SHIPPED = {"awq-int4", "awq-int4-tuned", "awq-int3", "int8-outlier", "fp8", "minitron-95m", "minitron-awq-int4"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_recipe_validates(name):
    recipe = load_recipe(RECIPES / f"{name}.yaml")
    assert recipe.model == "smollm2-135m"
    assert recipe.stages[-1].kind == "eval" and recipe.stages[-1].inputs[0] == "model"


def test_the_shipped_recipes_are_the_ones_documented():
    assert {p.stem for p in RECIPES.glob("*.yaml")} == SHIPPED


def test_the_pipeline_recipe_chains_its_stages():
    recipe = load_recipe(RECIPES / "minitron-awq-int4.yaml")
    assert [(s.name, s.kind, s.inputs) for s in recipe.stages] == [
        ("minitron", "prune-distill", ["model"]), ("awq-int4", "quantize", ["minitron"]),
        ("eval", "eval", ["model", "minitron", "awq-int4"])]
    prune, distill = recipe.stages[0].configs["prune"], recipe.stages[0].configs["distill"]
    assert prune.target_params == 95_000_000 and distill.lr == 3e-4 and distill.tokens >= distill.tokens_per_step


def test_defaults_chain_the_stages_and_compare_every_model():
    recipe = load_recipe(RECIPES / "awq-int4.yaml")
    assert [s.inputs for s in recipe.stages] == [["model"], ["model", "awq-int4"]]


def test_set_and_model_override_the_file():
    recipe = load_recipe(RECIPES / "awq-int4.yaml", "other", ("awq-int4.bits=3", "eval.tasks=[wikitext, mmlu]", "eval.limit=2"))
    assert recipe.model == "other" and recipe.stage("awq-int4").configs["quantize"].bits == 3
    assert recipe.stage("eval").configs["eval"].tasks == ["wikitext", "mmlu"]
    assert recipe.stage("eval").lines["limit"] == "--set"


def test_distill_false_only_prunes(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("p:\n  kind: prune-distill\n  num_layers: 20\n  distill: false\n")
    configs = load_recipe(path).stage("p").configs
    assert configs["distill"] is None and configs["prune"].num_layers == 20


def cli_error(monkeypatch, capsys, *args) -> str:
    """Run `compress ARGS` in process as the program does; return its one line on stderr after exit 2."""
    monkeypatch.setattr(sys, "argv", ["compress", *args])
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit_:
            run_command(cli)
    finally:
        signal.signal(signal.SIGTERM, handler)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    return err[0]


Q = "model: smollm2-135m\nq:\n  kind: quantize\n"  # the stage q starts on line 2, its keys on line 4


@pytest.mark.parametrize("text, fragment", [
    (Q + "  bitz: 3\n", ":4: q.bitz: unknown key for kind quantize; did you mean bits?"),
    (Q + "  colour: red\n", ":4: q.colour: unknown key for kind quantize; the keys are method, bits"),
    (Q + "  bits: four\n", ":4: q.bits: expected an integer, got 'four'"),
    (Q + "  calib_samples: true\n", ":4: q.calib_samples: expected an integer, got True"),
    (Q + "  group_size: 6.5\n", ":4: q.group_size: expected an integer or null, got 6.5"),
    (Q + "  bits: 5\n", ":4: q.bits: bits 5 is not supported for awq"),
    (Q + "  method: awq\n  bits: 3\n  format: awq\n", ":6: q.format: format awq (AutoAWQ GEMM) holds asymmetric 4-bit"),
    (Q + "  method: fp8\n  symmetric: true\n", ":5: q.symmetric: group_size and symmetric apply to awq and rtn"),
    (Q + "  bits: 3\n  bits: 4\n", ":5: q.bits: duplicate key"),
    (Q + "  input: later\nlater:\n  kind: prune-distill\n  num_layers: 2\n",
     ":4: q.input: 'later' is this stage or a later one"),
    (Q + "  input: nope\n", ":4: q.input: 'nope' is not a stage"),
    (Q + "r:\n  kind: quantize\n", ":4: r.input (default: the previous model stage): 'q' is quantized"),
    (Q + "p:\n  kind: prune-distill\n  input: q\n  num_layers: 2\n", ":6: p.input: 'q' is quantized"),
    (Q + "e:\n  kind: eval\n  models: [model, e]\n", ":6: e.models: 'e' is this stage or a later one"),
    (Q + "e:\n  kind: eval\n  tasks: wikitext\n", ":6: e.tasks: expected a list of strings, got 'wikitext'"),
    (Q + "e:\n  kind: eval\n  report: here\n", ":6: e.report: unknown key for kind eval"),
    ("e:\n  kind: eval\nq:\n  kind: quantize\n  input: e\n", ":5: q.input: 'e' is an eval stage"),
    ("q:\n  method: awq\n", ":1: q.kind: expected one of prune-distill, quantize, eval, got nothing"),
    ("p:\n  kind: prune-distill\n  target_params: lots\n", ":3: p.target_params: 'lots' is not a count"),
    ("p:\n  kind: prune-distill\n  tokens: 30k\n", ":1: p: give either target_params or explicit sizes"),
    ("p:\n  kind: prune-distill\n  num_layers: 2\n  tokens: 10\n", ":4: p.tokens: tokens 10 is below one step"),
    ("p:\n  kind: prune-distill\n  num_layers: 2\n  distill: false\n  lr: 1.0e-3\n",
     ":5: p.lr: a distillation setting, but `distill: false`"),
    ("p/x:\n  kind: quantize\n", ":1: p/x: a stage name is a folder name"),
    ("q:\n  kind: quantize\n   bits: 3\n", ":3: not valid YAML"),
    ("- q\n", ":1: a recipe is a mapping"),
    ("model: [a]\nq:\n  kind: quantize\n", ":1: model: expected a model name or path"),
])
def test_bad_recipe_is_one_line_with_file_and_line(tmp_path, monkeypatch, capsys, text, fragment):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    line = cli_error(monkeypatch, capsys, "run", str(path), "-o", str(tmp_path / "out"))
    assert line.startswith(f"error: {path}:") and fragment in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, fragment", [
    (["--set", "q.bits=5"], "error: --set: q.bits: bits 5 is not supported"),
    (["--set", "q.bitz=3"], "error: --set: q.bitz: unknown key"),
    (["--set", "r.bits=3"], "error: --set: r.bits: no stage 'r' in the recipe (stages: q)"),
    (["--set", "bits"], "error: --set: 'bits' is not KEY=VALUE"),
    (["--set", "q.calib_seq_len=[1"], "error: --set: q.calib_seq_len: '[1' is not a YAML value"),
    (["--from", "zz"], "error: --from zz: no stage 'zz'"),
])
def test_bad_command_line_is_one_line(tmp_path, monkeypatch, capsys, args, fragment):
    path = tmp_path / "r.yaml"
    path.write_text(Q)
    assert fragment in cli_error(monkeypatch, capsys, "run", str(path), "-o", str(tmp_path / "out"), *args)


def test_missing_data_is_found_before_any_work(tmp_path, monkeypatch, capsys):
    model = save_hf(tiny_hf("llama"), tmp_path / "model")
    capsys.readouterr()  # transformers' progress bars
    path = tmp_path / "r.yaml"
    path.write_text("q:\n  kind: quantize\n  method: rtn\ne:\n  kind: eval\n")
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    line = cli_error(monkeypatch, capsys, "run", str(path), "--model", str(model), "-o", str(tmp_path / "out"))
    assert f"{path}:4: e.tasks: data file wikitext2/wiki.test.raw not found" in line
    assert not (tmp_path / "out").exists()
