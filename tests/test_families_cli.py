"""The CLI verbs on a tiny checkpoint of every family that transformers wrote (SmolLM2's tokenizer copied in):
generate, eval and info run and agree with transformers where there is a number to compare."""

import json
import math
import re

import pytest

from tests.conftest import run_main, save_hf, tiny_hf
from tests.families import NEW


@pytest.fixture(params=NEW)
def family(request, tmp_path, smollm2_dir):
    hf = tiny_hf(request.param, vocab=49152, features=True)
    return hf, save_hf(hf, tmp_path / request.param, smollm2_dir)


def test_generate_eval_and_info(monkeypatch, capsys, data_dir, family):
    hf, model_dir = family
    code, out, err = run_main(monkeypatch, capsys, "generate", str(model_dir), "The capital of France is", "--max-tokens", "4")
    assert code == 0 and out.strip(), err

    code, out, err = run_main(monkeypatch, capsys, "eval", str(model_dir), "--tasks", "wikitext", "--seq-len", "32",
                              "--limit-tokens", "64")
    assert code == 0, err
    ppl = float(re.search(rf"\| {re.escape(str(model_dir))} \| [\d.]+ \| ([\d.]+) \|", out).group(1))
    assert math.isfinite(ppl) and ppl > 1

    code, out, err = run_main(monkeypatch, capsys, "info", str(model_dir))
    assert code == 0, err
    total = int(re.search(r"total\s+([\d,]+)", out).group(1).replace(",", ""))
    assert total == sum(p.numel() for p in hf.parameters())  # every projection, bias and norm of the family counted


def test_an_unsupported_model_type_is_one_line(monkeypatch, capsys, tmp_path):
    model_dir = save_hf(tiny_hf("llama"), tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text()) | {"model_type": "deepseek_v3"}
    (model_dir / "config.json").write_text(json.dumps(config))
    capsys.readouterr()  # transformers' progress bar while saving
    for argv in (["info", str(model_dir)], ["generate", str(model_dir), "hi"], ["eval", str(model_dir), "--limit-tokens", "64"]):
        code, _, err = run_main(monkeypatch, capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "deepseek_v3" in err, err
