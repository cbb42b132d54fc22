"""Bad input gives one line on stderr and exit code 2, with nothing written."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import read_json, run_main, save_hf, tiny_hf


def run(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "compress.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def assert_one_line_error(res, *fragments):
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.fixture
def fp_dir(tmp_path):
    return save_hf(tiny_hf("llama"), tmp_path / "fp")


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



def assert_one_line(code: int, err: str, *fragments: str) -> None:
    """run_main's (code, stderr) of bad input: exit 2 and one line naming the fragments."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]


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


@pytest.mark.parametrize("args,fragment", [
    (("quantize", "m", "--bits", "abc", "-o", "o"), "'--bits': 'abc' is not a valid integer"),
    (("quantize",), "Missing argument 'MODEL'"),
    (("nosuch",), "No such command 'nosuch'"),
    (("info", "m", "--gpu", "v100"), "'--gpu'"),
])
def test_usage_errors_are_one_line(monkeypatch, capsys, args, fragment):
    assert_one_line(*run_main(monkeypatch, capsys, *args)[::2], fragment, "--help")


@pytest.mark.parametrize("name,content,fragment", [
    ("calib.jsonl", '{"text": "fine"}\n{"text": 5}\n', 'calib.jsonl:2: "text" is int, not a string'),
    ("calib.jsonl", "not json\n", "calib.jsonl:1: not JSON"),
    ("calib.jsonl", '{"txt": "a"}\n', 'calib.jsonl:1: no "text" field'),
    ("calib.jsonl", "[1, 2]\n", 'calib.jsonl:1: no "text" field'),
    ("calib.txt", b"\xff\xfe\x00binary", "not a UTF-8 text file"),
    ("calib.csv", "text\nhello\n", "unknown file type '.csv'"),
    ("", None, "calibration data path is empty"),
])
def test_bad_calibration_data(tiny_dir, tmp_path, monkeypatch, capsys, name, content, fragment):
    calib = tmp_path / name
    if content is not None:
        calib.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(tiny_dir), "--calib-data", str(calib) if name else "", "-o", str(out))
    assert_one_line(code, err, fragment)
    assert not out.exists()


def test_bad_distillation_data(tiny_dir, tmp_path, monkeypatch, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": ["a", "list"]}\n')
    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "prune-distill", str(tiny_dir), "--num-layers", "1", "--data", str(data), "-o", str(out))
    assert_one_line(code, err, '"text" is list, not a string')
    code, _, err = run_main(monkeypatch, capsys, "prune-distill", str(tiny_dir), "--num-layers", "1", "--data", "", "-o", str(out))
    assert_one_line(code, err, "calibration data path is empty")
    assert list(tmp_path.iterdir()) == [data]


@pytest.mark.parametrize("config,fragment", [
    ('{"model_type": ', "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"model_type": "llama", "vocab_size": 256}', "lacks hidden_size"),
])
def test_malformed_config_json(fp_dir, tmp_path, monkeypatch, capsys, config, fragment):
    (fp_dir / "config.json").write_text(config)
    assert_one_line(*run_main(monkeypatch, capsys, "info", str(fp_dir))[::2], fragment)
    out = tmp_path / "out"
    assert_one_line(*run_main(monkeypatch, capsys, "quantize", str(fp_dir), "--method", "rtn", "-o", str(out))[::2], fragment)
    assert not out.exists()


def test_truncated_safetensors(fp_dir, monkeypatch, capsys):
    weights = fp_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert_one_line(*run_main(monkeypatch, capsys, "info", str(fp_dir))[::2], "truncated")


def unwritable_outputs(tmp_path) -> list[tuple[str, str]]:
    """(-o value, error fragment): empty, under a file, and (on Linux) where no directory can be made."""
    (tmp_path / "afile").write_text("mine")
    cases = [("", "-o is empty"), (str(tmp_path / "afile" / "out"), "is a file, not a directory")]
    if Path("/proc/self").is_dir():
        cases.append(("/proc/compress-out", "cannot write in /proc"))
    return cases


@pytest.mark.parametrize("verb", ["quantize", "prune-distill", "run"])
def test_unwritable_output(verb, fp_dir, tmp_path, monkeypatch, capsys):
    args = {"quantize": ("quantize", str(fp_dir), "--method", "rtn"),
            "prune-distill": ("prune-distill", str(fp_dir), "--num-layers", "1", "--no-distill"),
            "run": ("run", str(Path(__file__).parents[1] / "recipes" / "awq-int4.yaml"), "--model", str(fp_dir))}[verb]
    for output, fragment in unwritable_outputs(tmp_path):
        assert_one_line(*run_main(monkeypatch, capsys, *args, "-o", output)[::2], fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "fp"]


@pytest.mark.parametrize("args,fragment", [
    (("--hidden-size", "0"), "--hidden-size must be at least 1, got 0"),
    (("--num-layers", "0"), "--num-layers must be at least 1, got 0"),
    (("--num-heads", "0"), "--num-heads must be at least 1"),
    (("--intermediate-size", "0"), "--intermediate-size must be at least 1"),
])
def test_zero_prune_sizes(fp_dir, tmp_path, monkeypatch, capsys, args, fragment):
    out = tmp_path / "out"
    assert_one_line(*run_main(monkeypatch, capsys, "prune-distill", str(fp_dir), *args, "--no-distill", "-o", str(out))[::2], fragment)
    assert not out.exists()


@pytest.mark.parametrize("args,fragment", [(("--batch", "0"), "--batch and --context"), (("--context", "-5"), "--context -5")])
def test_bad_info_options(fp_dir, monkeypatch, capsys, args, fragment):
    assert_one_line(*run_main(monkeypatch, capsys, "info", str(fp_dir), *args)[::2], fragment)


def test_eval_task_without_offline_data(tiny_dir, tmp_path):
    """An lm-eval task whose dataset is not in the (here empty) datasets cache: one line before any work."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets"), "HF_HUB_OFFLINE": "1"}
    res = run("eval", str(tiny_dir), "--tasks", "hellaswag", env=env)
    assert_one_line_error(res, "the data of task hellaswag is not available offline", "COMPRESS_ALLOW_DOWNLOAD=1")


@pytest.mark.parametrize("report,fragment", [
    ("afile/sub", "is a file, not a directory"), ("", "is not a directory name"), ("other", "holds other files"),
])
def test_bad_eval_report(fp_dir, tmp_path, monkeypatch, capsys, report, fragment):
    (tmp_path / "afile").write_text("mine")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    code, _, err = run_main(monkeypatch, capsys, "eval", str(fp_dir), "--report", str(tmp_path / report) if report else "")
    assert_one_line(code, err, "--report", fragment)
    assert (tmp_path / "other" / "keep.txt").read_text() == "mine"


def test_bad_recipe_files(tmp_path, monkeypatch, capsys):
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00\x01")
    assert_one_line(*run_main(monkeypatch, capsys, "run", str(tmp_path / "binary.yaml"))[::2], "not a UTF-8 text file")
    assert_one_line(*run_main(monkeypatch, capsys, "run", str(tmp_path))[::2], "is a directory")


@pytest.mark.parametrize("draft,fragment", [("nonexistent-draft", "draft: model 'nonexistent-draft' not found"),
                                            ("", "draft: the model name is empty"), ("FP", "no tokenizer files")])
def test_bad_draft_fails_before_the_target_loads(tiny_dir, fp_dir, monkeypatch, capsys, draft, fragment):
    draft = str(fp_dir) if draft == "FP" else draft
    code, _, err = run_main(monkeypatch, capsys, "generate", str(tiny_dir), "Hi", "--draft", draft)
    assert_one_line(code, err, fragment)  # no "runtime: KV cache ..." line: the target was not loaded


@pytest.mark.parametrize("args,fragment", [
    (("--plot", "plot.txt"), "must end in .png"),
    (("--kv-cache-memory", "0"), "--kv-cache-memory must be a positive"),
    (("--draft", "nonexistent-draft"), "model 'nonexistent-draft' not found"),
    (("--compare", ""), "model name is empty"),
    (("--batch-sizes", "1", "--prompt-len", "1000"), "do not fit the context"),
    (("--workload", "mixed", "--max-prompt", "1000"), "do not fit the context"),
])
def test_bad_bench_options_fail_before_any_work(tiny_dir, tmp_path, monkeypatch, capsys, args, fragment):
    monkeypatch.chdir(tmp_path)
    assert_one_line(*run_main(monkeypatch, capsys, "bench", str(tiny_dir), *args)[::2], fragment)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,fragment", [
    (("--port", "99999"), "--port must be in 0..65535, got 99999"),
    (("--port", "-1"), "--port must be in 0..65535"),
    (("--host", ""), "--host is empty"),
    (("--host", "not a host!"), "--host not a host! is not an address"),
    (("--max-waiting", "-1"), "--max-waiting"),
    (("--max-body-bytes", "0"), "--max-body-bytes"),
    (("--served-model-name", ""), "--served-model-name is empty"),
    (("--api-key", ""), "--api-key is empty"),
])
def test_bad_serve_options_fail_before_the_model_loads(monkeypatch, capsys, args, fragment):
    # MODEL does not exist: an option that were not checked first would fail with "not found" instead
    assert_one_line(*run_main(monkeypatch, capsys, "serve", "nonexistent-model", *args)[::2], fragment)


def test_serve_on_a_port_in_use(monkeypatch, capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run_main(monkeypatch, capsys, "serve", "nonexistent-model", "--port", str(port))
    assert_one_line(code, err, f"cannot listen on 127.0.0.1:{port}")
