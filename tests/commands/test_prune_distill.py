"""`compress prune-distill` end to end on a tiny model, and its bad input: one line, exit 2, no OUT."""

import json

import pytest
import torch

from tests.conftest import read_json
from tests.test_cli import assert_one_line_error, run


SMALL = ["--hidden-size", "48", "--intermediate-size", "96", "--num-layers", "2", "--calib-samples", "2",
         "--calib-seq-len", "16", "--seq-len", "16", "--batch-size", "2", "--eval-every", "2", "--save-every", "2"]


def test_prune_and_distill_write_a_plain_hf_checkpoint(model_and_text, tmp_path):
    from transformers import AutoModelForCausalLM

    model, text = model_and_text
    out = tmp_path / "out"
    res = run("prune-distill", str(model), *SMALL, "--tokens", "256", "--data", str(text), "--importance", "magnitude", "-o", str(out))
    assert res.returncode == 0, res.stderr
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert (hf.config.hidden_size, hf.config.intermediate_size, hf.config.num_hidden_layers) == (48, 96, 2)
    doc = read_json(out / "compress.json")
    assert len(doc["keep"]["channels"]) == 48 and len(doc["keep"]["layers"]) == 2
    assert [p["step"] for p in doc["distill_curve"]] == list(range(9))
    assert "held_out_ppl" in doc["distill_curve"][-1]
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no staging or checkpoint left behind


@pytest.mark.parametrize("args, fragment", [
    (["--target-params", "1B"], "is not below the model's"),
    (["--hidden-size", "48", "--num-heads", "3", "--num-kv-heads", "2"], "multiple of --num-kv-heads"),
    (["--hidden-size", "48", "--tokens", "10"], "below one step"),
    (["--hidden-size", "48", "--data", "/nonexistent/text.jsonl"], "not found"),
    (["--hidden-size", "48", "--target-params", "1M"], "not both"),
])
def test_bad_input_is_one_line_and_writes_nothing(model_and_text, tmp_path, args, fragment):
    model, _ = model_and_text
    out = tmp_path / "out"
    assert_one_line_error(run("prune-distill", str(model), *args, "--calib-samples", "2", "--calib-seq-len", "16",
                              "-o", str(out)), fragment)
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_no_distill_only_prunes(model_and_text, tmp_path):
    model, _ = model_and_text
    out = tmp_path / "out"
    res = run("prune-distill", str(model), "--num-layers", "2", "--importance", "random", "--no-distill", "-o", str(out))
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "compress.json").read_text())
    assert doc["distill_curve"] == [] and doc["recipe"]["distill"] is None and doc["shape"]["num_layers"] == 2
