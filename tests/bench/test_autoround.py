"""compress.bench.autoround without AutoRound's venv: the missing-venv error, the command line, the environment,
and run_autoround's staging with a fake python that writes what AutoRound would."""

import json
import os
import stat
import sys

import pytest

from compress.bench import autoround
from compress.errors import UserError


def test_missing_venv_is_one_line_naming_the_variable_and_the_setup(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_AUTOROUND_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(UserError) as e:
        autoround.autoround_python()
    msg = str(e.value)
    assert "\n" not in msg and "COMPRESS_AUTOROUND_PYTHON" in msg and autoround.SETUP in msg


def test_default_python_is_the_venv(monkeypatch):
    monkeypatch.delenv("COMPRESS_AUTOROUND_PYTHON", raising=False)
    if os.path.isfile(autoround.DEFAULT_PYTHON):
        assert str(autoround.autoround_python()) == autoround.DEFAULT_PYTHON
    else:
        with pytest.raises(UserError):
            autoround.autoround_python()


def test_command_runs_its_cli_on_the_cpu_with_our_calibration_file(tmp_path):
    cmd = autoround.command(tmp_path / "py", tmp_path / "src", tmp_path / "out", "gguf:q4_k_m", 50, 32, 512, tmp_path / "c.jsonl")
    assert cmd == [str(tmp_path / "py"), "-m", "auto_round", "--model", str(tmp_path / "src"), "--format", "gguf:q4_k_m",
                   "--iters", "50", "--nsamples", "32", "--seqlen", "512", "--dataset", str(tmp_path / "c.jsonl"),
                   "--device", "cpu", "--output_dir", str(tmp_path / "out")]


def test_environment_is_offline_without_our_pythonpath(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/main")
    env = autoround.environment()
    assert "PYTHONPATH" not in env and env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"


FAKE = """#!{python}
import os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
out = args["--output_dir"]
assert os.getcwd() == out, "runs from a neutral directory"
if args["--format"].startswith("gguf"):
    open(os.path.join(out, "model-q4_0.gguf"), "wb").write(b"GGUF")
else:
    os.makedirs(os.path.join(out, "model-w4g128"))
    open(os.path.join(out, "model-w4g128", "config.json"), "w").write("{{}}")
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
"""


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    path = tmp_path / "fake-python"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("COMPRESS_AUTOROUND_PYTHON", str(path))
    return path


@pytest.mark.parametrize("fmt, written", [("gguf:q4_0", "model-q4_0.gguf"), ("auto_round", "model-w4g128")])
def test_run_returns_what_was_written_and_replaces_the_output(fake_python, tmp_path, fmt, written):
    out = tmp_path / "ar-out"
    out.mkdir()
    (out / "stale").write_text("old")
    path, seconds = autoround.run_autoround(tmp_path, out, fmt, 0, 4, 16, tmp_path / "c.jsonl")
    assert path == out / written and path.exists() and seconds > 0
    assert not (out / "stale").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging directory left


def test_a_failed_run_leaves_the_old_output_and_no_staging(fake_python, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT", "3")
    out = tmp_path / "ar-out"
    out.mkdir()
    (out / "kept").write_text("old")
    with pytest.raises(UserError, match="exited with 3"):
        autoround.run_autoround(tmp_path, out, "gguf:q4_0", 0, 4, 16, tmp_path / "c.jsonl")
    assert (out / "kept").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_calibration_file_holds_our_rows(smollm2_dir, data_dir, tmp_path):
    from types import SimpleNamespace

    from compress.calib import calibration_tokens
    from compress.models import load_tokenizer

    tok = load_tokenizer(smollm2_dir)
    path = autoround.calibration_file(tok, tmp_path / "c.jsonl", nsamples=3, seqlen=64)
    rows = calibration_tokens(tok, SimpleNamespace(calib_data=None, seed=0, calib_samples=3, calib_seq_len=64))
    lines = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert len(lines) == 3
    for text, row in zip(lines, rows):
        ids = tok(text, add_special_tokens=False).input_ids
        assert len(ids) >= 64 and ids[:56] == row[:56].tolist()  # the same tokens, up to the last word's re-tokenization


def test_command_passes_the_scheme_flags_last(tmp_path):
    cmd = autoround.command(tmp_path / "py", tmp_path / "src", tmp_path / "out", "fake", 200, 128, 512, tmp_path / "c.jsonl",
                            ("--bits", "4", "--group_size", "64", "--asym"))
    assert cmd[cmd.index("--format") + 1] == "fake" and cmd[-5:] == ["--bits", "4", "--group_size", "64", "--asym"]
