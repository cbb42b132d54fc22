"""GGUF files of every family llama.cpp runs: read back (by transformers' GGUF reader, which also checks the
metadata and llama's q/k row order) they compute what we computed, and each tensor holds our rounding."""

import hashlib
import json

import gguf
import numpy as np
import pytest
import torch

from compress import models
from compress.commands.quantize_gguf import run_quantize_gguf
from compress.gguf import rounding
from compress.gguf.family import permute_rows
from compress.gguf.types import FILE_TYPES, tensor_type
from compress.quant.config import QuantConfig
from tests.conftest import save_hf, tiny_hf

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
IDS = torch.tensor([[504, 3575, 282, 4649, 314, 7042, 30, 1183, 3575, 282, 6671, 314]])
# hidden 256 so that K-quant blocks fit a row; 2 layers: layer 1's attn_v and ffn_down are Q6_K in Q4_K_M.
SIZES = dict(vocab=49152, hidden_size=256, intermediate_size=512)


def source(tmp_path, kind: str, tokenizer_dir, **kw):
    return save_hf(tiny_hf(kind, **SIZES, **kw), tmp_path / f"src-{kind}", tokenizer_dir)


def write(src, out, **kw):
    return run_quantize_gguf(str(src), QuantConfig(format="gguf", **({"method": "rtn"} | kw)), str(out))


def logits(model_dir) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)(IDS).logits[0]


def read_back(path) -> torch.Tensor:
    """Logits of a quantized GGUF as our reader holds it (ggml's own codes, docs/gguf.md) and our decoder runs it."""
    with torch.no_grad():
        return models.load_model(models.resolve(str(path)))(IDS)[0]


@pytest.fixture
def remembered_rounding(monkeypatch):
    """rounding.weight_only remembered by (type, weight bytes): the writer and a test's own rounding of the same
    49,152-row tables search once (those searches are most of these tests' time)."""
    real, seen = rounding.weight_only, {}

    def weight_only(kind, w, keep_weight=True, desc=None):
        key = (kind, tuple(w.shape), hashlib.sha256(w.detach().float().contiguous().numpy().tobytes()).hexdigest())
        if key not in seen:
            seen[key] = real(kind, w)
        return seen[key]

    monkeypatch.setattr(rounding, "weight_only", weight_only)


# Gemma 2 as transformers' GGUF reader rebuilds it (its defaults: soft-caps 50 and 30, query_pre_attn_scalar 256 =
# head_dim), with a window of 4 so that the 12-token input slides in layer 0.
GEMMA2 = dict(sliding_window=4, head_dim=256, query_pre_attn_scalar=256)
# Gemma 3 likewise (its rope bases 1e6 global and 1e4 sliding), 6 layers: llama.cpp's pattern of five sliding, one full.
GEMMA3 = GEMMA2 | dict(num_hidden_layers=6)
OVERRIDES = {"gemma2": GEMMA2, "gemma3_text": GEMMA3}


@pytest.mark.parametrize("kind", (*FAMILIES, *OVERRIDES))
def test_unquantized_file_reads_back_as_the_same_model(tmp_path, monkeypatch, smollm2_dir, kind):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, kind, smollm2_dir, tie_word_embeddings=kind in ("qwen3", *OVERRIDES), **OVERRIDES.get(kind, {}))
    out = write(src, tmp_path / "m.gguf", gguf_type="F32")
    back = models.resolve(str(out))  # transformers' GGUF reader: config from our metadata, q/k rows un-permuted
    ref = logits(src)
    assert (logits(back) - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    assert not list(tmp_path.glob(".m.gguf.partial-*"))


def dequantized(path) -> dict[str, tuple[str, torch.Tensor]]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))))
            for t in reader.tensors}


@pytest.mark.parametrize("gguf_type", ["Q4_0", "Q4_1", "Q4_K_M", "Q8_0"])
def test_each_tensor_holds_our_rounding_in_llama_cpp_s_type(tmp_path, smollm2_dir, gguf_type):
    src = source(tmp_path, "llama", smollm2_dir)
    tensors = dequantized(write(src, tmp_path / "m.gguf", gguf_type=gguf_type))
    hf = __import__("transformers").AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    ft, kinds = FILE_TYPES[gguf_type], set()
    for name, role, heads in (("q_proj", "attn_q", 4), ("k_proj", "attn_k", 2), ("v_proj", "attn_v", None),
                              ("down_proj", "ffn_down", None)):
        for i in range(2):
            mod = "self_attn" if role.startswith("attn") else "mlp"
            w = getattr(getattr(hf.model.layers[i], mod), name).weight.detach()
            kind = tensor_type(ft, role, w.shape[1], i, 2)
            stored_kind, stored = tensors[f"blk.{i}.{role}.weight"]
            ours = rounding.weight_only(kind, w)[1]
            assert stored_kind == kind
            assert torch.equal(stored.reshape(w.shape), permute_rows(ours, heads) if heads else ours)
            kinds.add(kind)
    assert tensors["output.weight"][0] == ("Q8_0" if gguf_type == "Q8_0" else "Q6_K")
    assert tensors["blk.0.attn_norm.weight"][0] == "F32"
    assert kinds == {"Q4_K_M": {"Q4_K", "Q6_K"}, "Q4_0": {"Q4_0"}, "Q4_1": {"Q4_1"}, "Q8_0": {"Q8_0"}}[gguf_type]


def rounded_in_memory(src, gguf_type: str):
    """The source model with every 2-D weight replaced by our rounding into its type (what the file should hold)."""
    from transformers import AutoModelForCausalLM

    hf, ft = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32), FILE_TYPES[gguf_type]
    roles = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output", "gate_proj": "ffn_gate",
             "up_proj": "ffn_up", "down_proj": "ffn_down", "embed_tokens": "token_embd", "lm_head": "output"}
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 2:
                parts = name.split(".")
                layer = int(parts[2]) if parts[1] == "layers" else 0
                kind = tensor_type(ft, roles[parts[-2]], p.shape[1], layer, hf.config.num_hidden_layers)
                p.copy_(rounding.weight_only(kind, p)[1])
    return hf


def test_4_bit_file_computes_what_we_rounded(tmp_path, monkeypatch, smollm2_dir, remembered_rounding):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, "qwen3", smollm2_dir)
    back = read_back(write(src, tmp_path / "m.gguf", gguf_type="Q4_K_M"))
    with torch.no_grad():
        ours, ref = rounded_in_memory(src, "Q4_K_M")(IDS).logits[0], logits(src)
    assert (back - ours).abs().max().item() <= 1e-4 * ours.abs().max().item()
    assert (ours - ref).abs().max().item() > 1e-2 * ref.abs().max().item()  # the rounding did change the model


def planted(src_dir, tokenizer_dir):
    """A tiny Llama whose norms carry large channels that its Linears undo: the same function, outliers in the
    activations (what AWQ's scales are for, as tests/quant/test_awq.py plants them)."""
    model, outliers = tiny_hf("llama", **SIZES, tie_word_embeddings=True), torch.tensor([3, 17, 100, 201])
    with torch.no_grad():
        for block in model.model.layers:
            for norm, parent, names in ((block.input_layernorm, block.self_attn, ("q_proj", "k_proj", "v_proj")),
                                        (block.post_attention_layernorm, block.mlp, ("gate_proj", "up_proj"))):
                norm.weight[outliers] *= 30
                for name in names:
                    getattr(parent, name).weight[:, outliers] /= 30
    return save_hf(model, src_dir, tokenizer_dir)


@pytest.mark.parametrize("gguf_type", ["Q4_K_M"])  # Q4_K Linears on searched grids, Q6_K ones on weighted grids
def test_awq_file_is_closer_to_the_source_than_rtn_and_tuned_closer_still(tmp_path, monkeypatch, smollm2_dir, data_dir, gguf_type, remembered_rounding):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = planted(tmp_path / "src", smollm2_dir)
    calib = dict(calib_samples=8, calib_seq_len=128, search_sequences=4, search_tokens=256)
    rtn = read_back(write(src, tmp_path / "rtn.gguf", gguf_type=gguf_type))
    awq = read_back(write(src, tmp_path / "awq.gguf", method="awq", gguf_type=gguf_type, **calib))
    tuned_file = write(src, tmp_path / "tuned.gguf", method="awq", gguf_type=gguf_type, tune_iters=30, **calib)
    tuned, ref = read_back(tuned_file), logits(src)
    assert (awq - ref).pow(2).mean() < 0.8 * (rtn - ref).pow(2).mean()
    assert (tuned - ref).pow(2).mean() < 0.9 * (awq - ref).pow(2).mean()
    recipe = json.loads(bytes(gguf.GGUFReader(tuned_file).fields["compress.recipe"].parts[-1]).decode())
    assert recipe["quantize"]["tune_iters"] == 30 and recipe["quantize"]["tune_dtype"] in ("float32", "bfloat16")
