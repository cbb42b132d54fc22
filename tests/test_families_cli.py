"""The CLI verbs on a tiny checkpoint of every family that transformers wrote (SmolLM2's tokenizer copied in):
generate, eval and info run and agree with transformers where there is a number to compare; a Qwen 3 GGUF is read."""

import json
import math
import re
from pathlib import Path

import pytest
import torch

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


def write_gguf(hf, arch: str, path: Path, extra: dict | None = None) -> Path:
    """``hf``'s fp32 tensors under llama.cpp's names for ``arch``, its sizes as GGUF keys, SmolLM2's tokenizer fields."""
    import gguf

    from compress.models import DEFAULT_MODEL, builtin_gguf

    c, w = hf.config, gguf.GGUFWriter(str(path), arch)
    for key, value in dict(context_length=c.max_position_embeddings, block_count=c.num_hidden_layers,
                           feed_forward_length=c.intermediate_size, embedding_length=c.hidden_size, head_count=c.num_attention_heads,
                           head_count_kv=c.num_key_value_heads, layer_norm_rms_eps=c.rms_norm_eps, rope_freq_base=10000.0,
                           key_length=c.head_dim, value_length=c.head_dim).items():
        getattr(w, f"add_{key}")(value)
    for key, f in gguf.GGUFReader(str(builtin_gguf(DEFAULT_MODEL))).fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, f.contents(), f.types[0], f.types[1] if len(f.types) > 1 else None)
    names = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), c.num_hidden_layers)
    tensors = {f"{names.get_name(name.rsplit('.', 1)[0])}.{name.rsplit('.', 1)[1]}": t for name, t in hf.state_dict().items()}
    for name, t in (tensors | (extra or {})).items():
        w.add_tensor(name, t.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_qwen3_gguf_runs_with_transformers_logits(monkeypatch, capsys, tmp_path, smollm2_dir):
    from compress.models import load_model, resolve

    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    hf = tiny_hf("qwen3", vocab=49152, head_dim=128)  # transformers reads no head_dim from a qwen3 GGUF: its default, 128
    path = write_gguf(hf, "qwen3", tmp_path / "tiny-qwen3.gguf")
    ids = torch.randint(0, 49152, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(load_model(resolve(str(path)))(ids), hf(ids).logits, atol=1e-4)
    code, out, err = run_main(monkeypatch, capsys, "generate", str(path), "The capital of France is", "--max-tokens", "4")
    assert code == 0 and out.strip(), err

    scaled = write_gguf(hf, "qwen3", tmp_path / "scaled.gguf", {"rope_freqs.weight": torch.ones(64)})
    code, _, err = run_main(monkeypatch, capsys, "info", str(scaled))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "rope_freqs.weight" in err, err
