"""Reading GGUF files back: a Q4_0 file keeps its codes (our int4 checkpoint with the file's exact weights), any
other type is dequantized; llama.cpp's rotary row order is undone either way."""

import gguf
import numpy as np
import torch

from compress import models
from compress.manifest import read_manifest
from compress.gguf.family import permute_rows, unpermute_rows
from compress.model.load import convert_gguf, open_decoder
from compress.models import load_model
from compress.quant.linear import PackedLinear
from tests.gguf.test_export import IDS, source, write


def test_unpermute_rows_inverts_llama_cpps_rotary_permute():
    heads, x = 3, torch.arange(12 * 4).reshape(12, 4)
    permuted = x.reshape(heads, 2, 12 // heads // 2, 4).swapaxes(1, 2).reshape(x.shape)  # convert_hf_to_gguf's permute
    assert torch.equal(permute_rows(x, heads), permuted)
    assert torch.equal(unpermute_rows(permuted, heads), x)


def file_weights(path) -> dict[str, torch.Tensor]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))) for t in reader.tensors}


def test_q4_0_file_reads_back_as_int4_with_the_files_own_weights(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, "llama", smollm2_dir)
    path = write(src, tmp_path / "m.gguf", gguf_type="Q4_0")
    back = models.resolve(str(path))
    assert models.is_quantized(back)
    model, stored = load_model(back), file_weights(path)
    for i, block in enumerate(model.model.layers):
        for hf_name, gguf_name, heads in (("self_attn.q_proj", "attn_q", 4), ("self_attn.k_proj", "attn_k", 2),
                                          ("self_attn.v_proj", "attn_v", None), ("mlp.down_proj", "ffn_down", None)):
            packed = block.get_submodule(hf_name)
            assert isinstance(packed, PackedLinear) and packed.spec.group_size == 32
            want = stored[f"blk.{i}.{gguf_name}.weight"].reshape(packed.out_features, packed.in_features)
            assert torch.equal(packed.dequantized(), unpermute_rows(want, heads) if heads else want)
    # the output layer (the tied embedding) as llama.cpp's Q4_0 rule types it: what the engine's defaults follow
    assert read_manifest(back)["gguf"] == {"file": "m.gguf", "linears": "Q4_0", "output": "Q6_K"}
    dequantized = tmp_path / "dequantized"
    dequantized.mkdir()
    convert_gguf(path, dequantized)  # transformers' reading of the same file, every tensor fp32
    with torch.no_grad():
        ours, ref = model(IDS), load_model(dequantized)(IDS)
    assert (ours - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_other_types_read_back_dequantized(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, "qwen2", smollm2_dir)
    back = models.resolve(str(write(src, tmp_path / "m.gguf", gguf_type="Q4_1")))
    assert not models.is_quantized(back) and read_manifest(back) is None  # the engine's defaults as for any fp32 model
    assert open_decoder(back).cfg.model_type == "qwen2"
