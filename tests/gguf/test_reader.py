"""Reading GGUF files back: a Q4_0 file keeps its codes (our int4 checkpoint with the file's exact weights), a mixture
of other block types keeps ggml's own codes (GgufLinear), F16/F32 Linears and built-in models are dequantized;
llama.cpp's rotary row order is undone either way."""

import gguf
import pytest
import numpy as np
import torch

from compress import models
from compress.manifest import read_manifest
from compress.gguf.family import permute_rows, unpermute_rows
from compress.gguf.reader import convert
from compress.model.load import open_decoder
from compress.models import load_model
from compress.quant.linear import GgufLinear
from compress.runtime.cpu_fusion import join_projections
from compress.runtime.cpu_linears import cpu_linears
from compress.runtime.cpu_modules import ByteLinear, FiveLinear, NibbleLinear, SixLinear
from tests.gguf.test_export import GEMMA2, IDS, source, write


def test_unpermute_rows_inverts_llama_cpps_rotary_permute():
    heads, x = 3, torch.arange(12 * 4).reshape(12, 4)
    permuted = x.reshape(heads, 2, 12 // heads // 2, 4).swapaxes(1, 2).reshape(x.shape)  # convert_hf_to_gguf's permute
    assert torch.equal(permute_rows(x, heads), permuted)
    assert torch.equal(unpermute_rows(permuted, heads), x)


def file_weights(path) -> dict[str, torch.Tensor]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: torch.from_numpy(np.array(gguf.quants.dequantize(t.data, t.tensor_type))) for t in reader.tensors}


def test_q4_0_file_keeps_its_codes_and_its_tied_q6_k_output_layer_s(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, "llama", smollm2_dir, tie_word_embeddings=True)
    path = write(src, tmp_path / "m.gguf", gguf_type="Q4_0")
    back = models.resolve(str(path))
    assert models.is_quantized(back)
    model, stored = load_model(back), file_weights(path)
    for i, block in enumerate(model.model.layers):
        for hf_name, gguf_name, heads in (("self_attn.q_proj", "attn_q", 4), ("self_attn.k_proj", "attn_k", 2),
                                          ("self_attn.v_proj", "attn_v", None), ("mlp.down_proj", "ffn_down", None)):
            m = block.get_submodule(hf_name)
            assert isinstance(m, GgufLinear) and m.kind == "Q4_0"
            want = stored[f"blk.{i}.{gguf_name}.weight"].reshape(m.out_features, m.in_features)
            assert torch.equal(m.dequantized(), unpermute_rows(want, heads) if heads else want)
    # the tied table as llama.cpp's Q4_0 rule types it (Q6_K: under a byte a weight) keeps its codes as the output
    # layer, the embedding a table of its own: the Linears then keep ggml's codes too
    assert read_manifest(back)["gguf"] == {"file": "m.gguf", "linears": "Q4_0", "output": "Q6_K"}
    assert "output.weight" not in stored and not model.cfg.tie_word_embeddings
    assert isinstance(model.lm_head, GgufLinear) and model.lm_head.kind == "Q6_K"
    assert torch.equal(model.lm_head.dequantized(), stored["token_embd.weight"].reshape(model.lm_head.weight_codes.shape))
    assert torch.equal(model.lm_head.dequantized(), model.model.embed_tokens.weight)
    dequantized = tmp_path / "dequantized"
    dequantized.mkdir()
    convert(path, dequantized, keep_codes=False)  # transformers' reading of the same file, every tensor fp32
    with torch.no_grad():
        ours, ref = model(IDS), load_model(dequantized)(IDS)
    assert (ours - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
    cpu_linears(model, int8_activations=False)  # its codes do not run: the output layer shares the embedding's table
    assert model.lm_head.weight is model.model.embed_tokens.weight
    held = load_model(back)
    cpu_linears(held, int8_activations=True)  # they do: the file's 6.625 bits a weight
    assert isinstance(held.lm_head, SixLinear)


def test_q4_k_m_file_keeps_ggml_s_codes_of_each_type(q4_k_m_gguf):
    path, back = q4_k_m_gguf  # every type a Q4_K_M file holds: Q5_0, Q8_0, Q4_K, Q6_K (see the fixture)
    assert read_manifest(back)["gguf"] == {"file": "m.gguf", "linears": "Q4_K,Q5_0,Q6_K,Q8_0", "output": "Q8_0"}
    model, stored = load_model(back), file_weights(path)
    kinds = {}
    for i, block in enumerate(model.model.layers):
        for hf_name, gguf_name, heads in (("self_attn.q_proj", "attn_q", 4), ("self_attn.v_proj", "attn_v", None),
                                          ("mlp.down_proj", "ffn_down", None)):
            m = block.get_submodule(hf_name)
            assert isinstance(m, GgufLinear)
            kinds[(i, gguf_name)] = m.kind
            want = stored[f"blk.{i}.{gguf_name}.weight"].reshape(m.out_features, m.in_features)
            assert torch.equal(m.dequantized(), unpermute_rows(want, heads) if heads else want)  # ggml's values exactly
    assert kinds == {(0, "attn_q"): "Q5_0", (0, "attn_v"): "Q5_0", (0, "ffn_down"): "Q4_K",
                     (1, "attn_q"): "Q5_0", (1, "attn_v"): "Q8_0", (1, "ffn_down"): "Q6_K"}
    assert isinstance(model.lm_head, GgufLinear) and model.lm_head.kind == "Q8_0"  # the untied output layer's codes too
    assert torch.equal(model.lm_head.dequantized(), stored["output.weight"].reshape(model.lm_head.weight_codes.shape))
    with torch.no_grad():
        ref = model(IDS)
        swapped = cpu_linears(model, int8_activations=True)  # as the engine holds them: nibbles and bytes
        join_projections(model)
        ours = model(IDS)
    held = {type(m) for g in swapped.groups for m in g.modules}
    assert held >= {ByteLinear, FiveLinear, NibbleLinear, SixLinear} and swapped.dequantized == 0
    assert isinstance(model.model.layers[0].self_attn.qkv, FiveLinear)  # all Q5_0: the file's 5.5 bits a weight
    assert isinstance(model.model.layers[1].mlp.down_proj, SixLinear)  # Q6_K: its own 6.625 bits a weight
    assert isinstance(model.lm_head, ByteLinear)  # Q8_0: its codes, not re-rounded to int8 rows
    assert isinstance(model.model.layers[1].self_attn.qkv, ByteLinear)  # Q5_0 q/k and a Q8_0 v: one byte-code Linear
    err = ((ours - ref).norm() / ref.norm()).item()
    assert err < 0.02  # only x's 8-bit rounding


def test_codes_are_read_block_by_block_never_through_a_whole_model(tmp_path, monkeypatch, q4_k_m_gguf):
    """The file is read from its memory map one block at a time (an 8B file is never held whole): transformers'
    reader, which dequantizes the whole model at once, is not called, and what is written is the fixture's reading."""
    from safetensors.torch import load_file

    from compress.gguf import metadata, reader

    path, _ = q4_k_m_gguf
    for d in ("ours", "transformers"):
        (tmp_path / d).mkdir()
    convert(path, tmp_path / "transformers", keep_codes=False)  # transformers' reading: every tensor fp32
    monkeypatch.setattr(metadata, "gguf_decoder", lambda p: pytest.fail("the whole model was loaded"))
    reader.convert(path, tmp_path / "ours")
    ours, theirs = ({k: v for f in sorted((tmp_path / d).glob("*.safetensors")) for k, v in load_file(f).items()}
                    for d in ("ours", "transformers"))
    plain = [k for k in theirs if not k.endswith("proj.weight") and k != "lm_head.weight"]  # embedding, norms: bit for bit
    assert len(plain) >= 2 * 2 + 2, plain
    assert all(torch.equal(ours[k], theirs[k]) for k in plain), [k for k in plain if not torch.equal(ours[k], theirs[k])]
    assert ours["model.layers.0.self_attn.q_proj.weight_codes"].dtype == torch.int8  # Q5_0's signed codes
    head = (ours["lm_head.weight_codes"].float().view(-1, 32) * ours["lm_head.weight_scale"].view(-1, 1)).view_as(theirs["lm_head.weight"])
    assert "lm_head.weight" not in ours and torch.equal(head, theirs["lm_head.weight"])  # the Q8_0 output layer's codes


def test_gemma2_file_keeps_its_codes_and_computes_as_transformers_reads_it(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, "gemma2", smollm2_dir, tie_word_embeddings=True, **GEMMA2)
    path = write(src, tmp_path / "m.gguf", gguf_type="Q8_0")  # Q8_0: the quickest rounding of the 49,152-row table
    back = models.resolve(str(path))
    model = load_model(back)
    assert isinstance(model.model.layers[1].self_attn.q_proj, GgufLinear)  # the file's codes, no q/k permutation
    # a tied Q8_0 table stays tied: its codes (a byte and a scale per 32) would run as int8 rows anyway
    assert read_manifest(back)["gguf"]["output"] == "Q8_0"
    assert model.cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    dequantized = tmp_path / "dequantized"
    dequantized.mkdir()
    convert(path, dequantized, keep_codes=False)  # transformers' dequantized weights (norms back to w: the file holds 1 + w)
    with torch.no_grad():
        ours, ref = model(IDS), load_model(dequantized)(IDS)
    assert (ours - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_built_in_model_is_the_unquantized_source(tmp_path, monkeypatch, q4_k_m_gguf):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "builtin_gguf", lambda name: q4_k_m_gguf[0])  # a file whose codes would be kept
    back = models.resolve(models.DEFAULT_MODEL)
    assert not models.is_quantized(back) and read_manifest(back) is None  # fp32: what the methods start from


def test_other_types_read_back_dequantized(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, "qwen2", smollm2_dir)
    back = models.resolve(str(write(src, tmp_path / "m.gguf", gguf_type="F16")))
    assert not models.is_quantized(back) and read_manifest(back) is None  # the engine's defaults as for any fp32 model
    assert open_decoder(back).cfg.model_type == "qwen2"
