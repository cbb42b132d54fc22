"""`compress quantize --format gguf` from the command line: the type each method gets, and bad input refused in one
line with exit 2 and nothing written."""

import gguf
import pytest

from tests.conftest import run_main, save_hf, tiny_hf

SIZES = dict(vocab=49152, hidden_size=256, intermediate_size=512)


@pytest.fixture(scope="module")
def src(tmp_path_factory, smollm2_dir):
    return save_hf(tiny_hf("llama", **SIZES), tmp_path_factory.mktemp("gguf-src") / "model", smollm2_dir)


@pytest.mark.parametrize("argv, expect", [
    (["--gguf-type", "Q4_0"], "--gguf-type applies to --format gguf"),
    (["--format", "gguf", "--method", "awq", "--bits", "3", "--gguf-type", "Q4_0"], "--bits 3 does not fit it"),
    (["--format", "gguf", "--method", "fp8"], "no fp8 type"),
    (["--format", "gguf", "--method", "int8", "--gguf-type", "Q4_K_M"], "--method int8 does not fit it"),
    (["--format", "gguf", "--method", "awq", "--gguf-type", "Q8_0"], "Q8_0 takes --method int8 or rtn"),
    (["--format", "gguf", "--group-size", "64"], "do not apply to --format gguf"),
    (["--format", "gguf", "--method", "int8", "--act-group-size", "16"], "--act-group-size and --smooth-alpha do not apply"),
    (["--format", "gguf", "--method", "int8", "--smooth-alpha", "0.5"], "--act-group-size and --smooth-alpha do not apply"),
])
def test_a_type_that_does_not_fit_the_method_is_one_line(monkeypatch, capsys, tmp_path, src, argv, expect):
    out = tmp_path / "m.gguf"
    code, stdout, err = run_main(monkeypatch, capsys, "quantize", str(src), *argv, "-o", str(out))
    assert code == 2 and expect in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_output_directory_that_does_not_exist_is_one_line(monkeypatch, capsys, tmp_path, src):
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(src), "--method", "rtn", "--format", "gguf",
                            "-o", str(tmp_path / "missing" / "m.gguf"))
    assert code == 2 and "missing" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_output_without_the_gguf_suffix_or_one_that_exists_is_refused(monkeypatch, capsys, tmp_path, src):
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(src), "--method", "rtn", "--format", "gguf",
                            "-o", str(tmp_path / "m.bin"))
    assert code == 2 and ".gguf" in err and list(tmp_path.iterdir()) == []
    (tmp_path / "m.gguf").write_bytes(b"keep")
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(src), "--method", "rtn", "--format", "gguf",
                            "-o", str(tmp_path / "m.gguf"))
    assert code == 2 and "--force" in err and (tmp_path / "m.gguf").read_bytes() == b"keep"


@pytest.mark.parametrize("kind, overrides, says", [
    ("phi3", {}, "phi3"), ("mixtral", {}, "mixtral"),
    ("gemma2", {"query_pre_attn_scalar": 144}, "query_pre_attn_scalar"),  # llama.cpp would scale scores by 1/16
    ("gemma2", {"layer_types": ["full_attention", "sliding_attention"]}, "sliding windows"),  # llama.cpp slides layer 0
    ("gemma3_text", {"head_dim": 256, "query_pre_attn_scalar": 256, "rope_parameters": {  # llama.cpp assumes 1e4
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 2e4}}}, "rotates sliding layers"),
])
def test_a_family_llama_cpp_cannot_run_from_our_file_is_one_line(monkeypatch, capsys, tmp_path, smollm2_dir, kind, overrides,
                                                                 says):
    src = save_hf(tiny_hf(kind, **SIZES, **overrides), tmp_path / "src", smollm2_dir)
    out = tmp_path / "out"
    out.mkdir()
    capsys.readouterr()  # save_hf's progress bar
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(src), "--method", "rtn", "--format", "gguf",
                            "-o", str(out / "m.gguf"))
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list(out.iterdir()) == []


def test_int8_writes_q8_0(monkeypatch, capsys, tmp_path, src):
    out = tmp_path / "m.gguf"
    code, stdout, err = run_main(monkeypatch, capsys, "quantize", str(src), "--method", "int8", "--format", "gguf",
                                 "-o", str(out))
    assert code == 0, err
    reader = gguf.GGUFReader(str(out))
    kinds = {t.name: t.tensor_type.name for t in reader.tensors}
    assert kinds["blk.0.attn_q.weight"] == kinds["blk.1.ffn_down.weight"] == kinds["output.weight"] == "Q8_0"
    assert reader.fields["general.file_type"].parts[-1][0] == 7  # LLAMA_FTYPE_MOSTLY_Q8_0
