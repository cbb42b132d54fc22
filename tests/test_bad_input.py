"""Bad input to every verb: one line on stderr, exit 2, no traceback, nothing written."""

from pathlib import Path

import pytest

from tests.conftest import run_main
from tests.test_cli import assert_one_line_error, run


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    """run_main's (code, stderr) of bad input: exit 2 and one line naming the fragments."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in lines[0], lines[0]


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
