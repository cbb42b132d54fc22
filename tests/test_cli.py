"""Bad input gives one line on stderr and exit code 2, with nothing written."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import read_json, run_main


def run(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "compress.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_one_line_error(res, *fragments):
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def test_missing_path(tmp_path):
    assert_one_line_error(run("info", str(tmp_path / "nope")), "not found")


def test_directory_without_weights(tmp_path, fp_dir):
    for f in fp_dir.glob("*.safetensors"):
        f.unlink()
    assert_one_line_error(run("info", str(fp_dir)), "no *.safetensors")


def test_pickle_weights_refused(fp_dir):
    for f in fp_dir.glob("*.safetensors"):
        f.rename(f.with_suffix(".bin"))
    assert_one_line_error(run("info", str(fp_dir)), "pickle", "safetensors")


def test_unsupported_model_type(fp_dir):
    cfg = read_json(fp_dir / "config.json") | {"model_type": "gpt2"}
    (fp_dir / "config.json").write_text(__import__("json").dumps(cfg))
    assert_one_line_error(run("info", str(fp_dir)), "gpt2", "llama")


def test_gguf_that_is_not_llama(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_one_line_error(run("info", str(path), env={"COMPRESS_CACHE": str(tmp_path / "cache")}), "GGUF")


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file({"a": torch.zeros(1)}, str(path))
    assert_one_line_error(run("info", str(path)), ".gguf")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--bits", "5"], "--bits 5"),
        (["--bits", "3", "--format", "awq"], "--format awq"),
        (["--group-size", "48"], "--group-size 48"),
        (["--rounding", "gptq"], "--rounding applies to --method awq"),
    ],
)
def test_bad_quantize_options(fp_dir, tmp_path, args, fragment):
    out = tmp_path / "out"
    assert_one_line_error(run("quantize", str(fp_dir), "--method", "rtn", *args, "-o", str(out)), fragment)
    assert not out.exists()


def test_output_exists(fp_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert_one_line_error(run("quantize", str(fp_dir), "--method", "rtn", "-o", str(out)), "--force")
    assert (out / "keep.txt").read_text() == "mine"


def test_calibration_text_too_short(tiny_dir, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("only a few words here")
    res = run("quantize", str(tiny_dir), "--calib-data", str(text), "-o", str(tmp_path / "out"))
    assert_one_line_error(res, "calibration text has")


def test_model_without_tokenizer_for_calibration(fp_dir, tmp_path):
    assert_one_line_error(run("quantize", str(fp_dir), "-o", str(tmp_path / "out")), "no tokenizer files")


def test_rtn_quantize_writes_complete_output(fp_dir, tmp_path):
    out = tmp_path / "out"
    res = run("quantize", str(fp_dir), "--method", "rtn", "--bits", "3", "-o", str(out))
    assert res.returncode == 0, res.stderr
    manifest = read_json(out / "compress.json")
    assert manifest["recipe"]["quantize"]["bits"] == 3
    assert set(manifest["sha256"]) >= {"model.safetensors", "config.json"}
    assert read_json(out / "config.json")["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] == 3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_interrupted_quantize_leaves_no_output(tmp_path, tiny_dir, data_dir):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "compress.cli", "quantize", str(tiny_dir), "--method", "awq",
                             "--calib-samples", "256", "-o", str(out)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not any(p.name.startswith(".out.partial") for p in tmp_path.iterdir()):
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()  # the search is running: staged output exists
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--method", "int8", "--outlier-threshold", "0"], "--outlier-threshold must be > 0"),
        (["--method", "int8", "--outlier-topk", "65"], "--outlier-topk 65 is larger than the narrowest Linear input (64"),
    ],
)
def test_bad_int8_fp8_options(fp_dir, tmp_path, args, fragment):
    out = tmp_path / "out"
    assert_one_line_error(run("quantize", str(fp_dir), *args, "-o", str(out)), fragment)
    assert not out.exists()


def test_fp8_without_float8_dtypes(fp_dir, tmp_path):
    script = "import sys, torch; del torch.float8_e4m3fn; from compress.cli import main; sys.argv[0] = 'compress'; main()"
    res = subprocess.run([sys.executable, "-c", script, "quantize", str(fp_dir), "--method", "fp8", "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert_one_line_error(res, "--method fp8 needs a torch with float8 dtypes")


def test_int8_quantize_writes_complete_output(fp_dir, tmp_path):
    out = tmp_path / "out"
    res = run("quantize", str(fp_dir), "--method", "int8", "--outlier-topk", "0", "--smooth-alpha", "0", "-o", str(out))  # no calibration
    assert res.returncode == 0, res.stderr
    assert read_json(out / "config.json")["quantization_config"]["quant_method"] == "compress-int8-outlier"
    assert read_json(out / "compress.json")["recipe"]["quantize"]["outlier_topk"] == 0


def test_version_prints_the_package_version(monkeypatch, capsys):
    from importlib.metadata import version

    import compress

    code, out, _ = run_main(monkeypatch, capsys, "--version")
    assert code == 0 and out == f"compress {compress.__version__}\n"
    assert version("compress") == compress.__version__


def test_no_arguments_lists_every_verb_with_an_example(monkeypatch, capsys):
    from compress.cli import EXAMPLES, cli

    code, out, err = run_main(monkeypatch, capsys)
    assert code == 0 and err == ""
    assert set(EXAMPLES) == set(cli.commands)  # a new verb needs its example
    for name, example in EXAMPLES.items():
        assert f"  {name} " in out and example in out and example.startswith(f"compress {name} ")
