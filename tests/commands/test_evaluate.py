"""`compress eval`: bad input is one line and exit 2; a short real run writes the report and compress.json."""

import json

import pytest

from tests.test_cli import assert_one_line_error, run


@pytest.mark.parametrize("args, fragment", [
    (["--tasks", "mmlu", "--num-fewshot", "6"], "--num-fewshot must be in 0..5"),
    (["--tasks", "no_such_task"], "unknown task no_such_task"),
    (["--tasks", "mmlu", "--limit", "0"], "--limit must be at least 1"),
])
def test_bad_options_are_one_line(tiny_dir, args, fragment):
    assert_one_line_error(run("eval", str(tiny_dir), *args), fragment)


def test_missing_data_dir_says_how_to_set_it(tiny_dir, tmp_path):
    res = run("eval", str(tiny_dir), "--tasks", "mmlu", env={"COMPRESS_DATA_DIR": str(tmp_path)})
    assert_one_line_error(res, str(tmp_path), "COMPRESS_DATA_DIR")


def test_hf_backend_refuses_formats_transformers_cannot_load(tiny_dir, tmp_path, data_dir):
    out = tmp_path / "int8"
    assert run("quantize", str(tiny_dir), "--method", "int8", "--calib-samples", "2", "--calib-seq-len", "32",
               "-o", str(out)).returncode == 0
    assert_one_line_error(run("eval", str(out), "--tasks", "mmlu", "--backend", "hf"), "use --backend compress")


@pytest.mark.slow
def test_short_mmlu_and_wikitext_run_writes_the_report(smollm2_dir, data_dir, tmp_path):
    import shutil

    model = shutil.copytree(smollm2_dir, tmp_path / "model")
    (model / "compress.json").write_text(json.dumps({"format": "fp"}))
    report = tmp_path / "report"
    res = run("eval", str(model), "--tasks", "mmlu,wikitext", "--limit", "2", "--limit-tokens", "2048",
              "--report", str(report), env={"COMPRESS_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr
    assert {p.name for p in report.iterdir()} == {"report.md", "report.json", "mmlu_groups.png", "ppl_vs_bytes.png"}
    doc = json.loads((report / "report.json").read_text())
    [row] = doc["models"]
    assert row["mmlu"]["all"]["n"] == 114 and 0 <= row["mmlu"]["all"]["acc"] <= 1
    assert set(row["mmlu"]) == {"subjects", "all", "stem", "humanities", "social_sciences", "other"}
    assert 5 < row["wikitext_ppl"] < 50
    quality = json.loads((model / "compress.json").read_text())["quality"]
    assert quality["mmlu_0shot_compress_limit2"]["all"] == round(row["mmlu"]["all"]["acc"], 4)
    assert "| MMLU all |" in (report / "report.md").read_text()
