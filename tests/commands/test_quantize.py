"""`compress quantize` on bf16/fp16 checkpoints: one block in memory at a time, sharded output in the source's dtype."""

import json

import pytest
import torch
from safetensors import safe_open

from compress.errors import UserError
from compress.model import lazy, shards
from compress.model.lazy import keeps_dtype
from compress.models import load_model
from compress.quant.config import QuantConfig
from compress.quant.export import QuantizedWriter
from compress.commands.quantize import run_quantize
from tests.conftest import tiny_hf
from tests.test_cli import assert_one_line_error, run

CALIB = dict(calib_samples=4, calib_seq_len=32, search_sequences=2, search_tokens=64)
METHODS = [
    QuantConfig(method="rtn", bits=4),
    QuantConfig(method="awq", bits=4, **CALIB),
    QuantConfig(method="int8", **CALIB),
    QuantConfig(method="fp8"),
    QuantConfig(method="fp8", static_activations=True, **CALIB),
]


def sharded_source(path, dtype, tokenizer_dir, layers=3):
    model = tiny_hf("llama", vocab=49152, num_hidden_layers=layers).to(dtype)
    model.save_pretrained(path, max_shard_size="300KB")
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer"):
            (path / f.name).write_bytes(f.read_bytes())
    return path


@pytest.fixture(scope="module")
def bf16_src(tmp_path_factory, smollm2_dir):
    return sharded_source(tmp_path_factory.mktemp("bf16") / "src", torch.bfloat16, smollm2_dir)


def stored_dtypes(out) -> dict[str, torch.dtype]:
    dtypes = {}
    for f in out.glob("*.safetensors"):
        with safe_open(f, "pt") as h:
            dtypes |= {k: h.get_tensor(k).dtype for k in h.keys()}
    return dtypes


def float_dtypes(out) -> set[torch.dtype]:
    """Dtypes of the tensors that follow the model's dtype (not codes, indices or fp16 outlier columns)."""
    return {dt for k, dt in stored_dtypes(out).items() if not keeps_dtype(k, dt)}


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c.method + ("-static" if c.static_activations else ""))
def test_one_block_in_memory_and_source_dtype_kept(cfg, bf16_src, tmp_path, data_dir, monkeypatch):
    import safetensors.torch

    monkeypatch.setattr(safetensors.torch, "load_file", lambda *a, **k: pytest.fail("a whole file was read"))
    seen = []
    materialize = lazy.materialize

    def spy(model, name, dtype, device="cpu"):
        seen.append(sum(not lazy.is_lazy(b) for b in model.model.layers))  # blocks in memory before this one
        return materialize(model, name, dtype, device)

    monkeypatch.setattr(lazy, "materialize", spy)
    out = run_quantize(str(bf16_src), cfg, str(tmp_path / "out"))
    assert len(seen) >= 3 and max(seen) == 0
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert float_dtypes(out) == {torch.bfloat16}


@pytest.mark.parametrize("fmt", ["compressed-tensors", "awq"])
def test_fp16_source_gives_fp16_in_both_formats(fmt, tmp_path, smollm2_dir):
    src = sharded_source(tmp_path / "src", torch.float16, smollm2_dir, layers=2)
    out = run_quantize(str(src), QuantConfig(method="rtn", bits=4, format=fmt), str(tmp_path / "out"))
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
    assert float_dtypes(out) == {torch.float16}


def test_dtype_override(bf16_src, tmp_path):
    out = run_quantize(str(bf16_src), QuantConfig(method="rtn", bits=4, dtype="float32"), str(tmp_path / "out"))
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    assert float_dtypes(out) == {torch.float32}


def test_sharded_output_reads_back_in_ours_and_transformers(bf16_src, tmp_path, monkeypatch):
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    monkeypatch.setattr(shards, "MAX_SHARD_BYTES", 2_000_000)
    out = run_quantize(str(bf16_src), QuantConfig(method="rtn", bits=4), str(tmp_path / "out"))
    assert len(list(out.glob("model-*-of-*.safetensors"))) > 1 and (out / "model.safetensors.index.json").is_file()
    ours = load_model(out, torch.bfloat16)
    assert ours.model.layers[0].mlp.up_proj.weight_scale.dtype == torch.bfloat16
    hf = AutoModelForCausalLM.from_pretrained(out, quantization_config=CompressedTensorsConfig(dequantize=True))
    assert hf.dtype == torch.bfloat16
    ids = torch.randint(0, 49152, (1, 12))
    with torch.no_grad():
        a, b = load_model(out)(ids), hf.float()(ids).logits
    assert ((a - b).norm() / a.norm()).item() <= 1e-2  # transformers dequantizes in bf16, we in fp32


def test_interrupted_streaming_export_leaves_no_output(bf16_src, tmp_path, monkeypatch):
    block = QuantizedWriter.block

    def interrupt(self, i, b):
        if i == 1:
            raise KeyboardInterrupt
        block(self, i, b)

    monkeypatch.setattr(QuantizedWriter, "block", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_quantize(str(bf16_src), QuantConfig(method="rtn", bits=4), str(tmp_path / "out"))
    assert list(tmp_path.iterdir()) == []


def test_already_quantized_source_is_refused(tiny_int4_dir, tmp_path):
    with pytest.raises(UserError, match="already quantized"):
        run_quantize(str(tiny_int4_dir), QuantConfig(method="rtn", bits=4), str(tmp_path / "out"))


@pytest.mark.parametrize("damage, fragment", [
    ("truncate", "truncated"),
    ("drop-shard", "missing, e.g."),
])
def test_broken_checkpoint_is_one_line_and_writes_nothing(damage, fragment, tmp_path, smollm2_dir):
    src = sharded_source(tmp_path / "src", torch.bfloat16, smollm2_dir, layers=2)
    shard = sorted(src.glob("model-*.safetensors"))[1]
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-100])
    else:
        shard.unlink()
    res = run("quantize", str(src), "--method", "rtn", "-o", str(tmp_path / "out"))
    assert_one_line_error(res, fragment)
    assert not (tmp_path / "out").exists()


def test_dtype_the_format_cannot_hold(bf16_src, tmp_path):
    res = run("quantize", str(bf16_src), "--method", "rtn", "--format", "awq", "--dtype", "bfloat16", "-o", str(tmp_path / "out"))
    assert_one_line_error(res, "--format awq", "float16")
    assert not (tmp_path / "out").exists()
