"""A GGUF's config: what transformers' mapping of the metadata drops (Gemma's attention scale and soft-caps, rope
scaling keys) is read back, so a file reads back as the model it was written from; what nothing reads is refused."""

import json
from types import SimpleNamespace

import pytest
import torch

from compress import models
from compress.errors import UserError
from compress.gguf.metadata import dropped_rope, gguf_config, with_dropped_keys
from compress.model.config import ModelConfig
from tests.gguf.test_export import IDS, logits, source, write

# Not transformers' defaults (soft-caps 50 / 30, query_pre_attn_scalar 256, no rope scaling): read from the file or
# from llama.cpp's rule (1 / sqrt(head_dim) for these shapes), not filled in.
CASES = {
    "gemma2": dict(sliding_window=4, head_dim=64, query_pre_attn_scalar=64, attn_logit_softcapping=20.0,
                   final_logit_softcapping=10.0, tie_word_embeddings=True),
    "gemma3_text": dict(sliding_window=4, head_dim=64, query_pre_attn_scalar=64, num_hidden_layers=6,
                        rope_scaling={"rope_type": "linear", "factor": 8.0}, tie_word_embeddings=True),
    "llama": dict(rope_scaling={"rope_type": "linear", "factor": 4.0}),
    "qwen2": dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
}
FIELDS = ("attn_scale", "attn_softcap", "final_softcap", "rope_theta", "rope_scaling", "local_rope")


ROPE_KEYS = ("rope_type", "factor", "original_max_position_embeddings")  # what GGUF's rope.scaling.* keys carry


def scaling(cfg: ModelConfig) -> dict | None:
    return None if cfg.rope_scaling is None else {k: v for k, v in cfg.rope_scaling.items() if k in ROPE_KEYS}


@pytest.mark.parametrize("kind", CASES)
def test_file_reads_back_with_the_keys_transformers_drops(tmp_path, monkeypatch, smollm2_dir, kind):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    src = source(tmp_path, kind, smollm2_dir, **CASES[kind])
    out = write(src, tmp_path / "m.gguf", gguf_type="F32")
    want, got = ModelConfig.from_hf(json.loads((src / "config.json").read_text())), gguf_config(out)
    for field in FIELDS:
        same = scaling(got) == scaling(want) if field == "rope_scaling" else getattr(got, field) == getattr(want, field)
        assert same, (field, getattr(got, field), getattr(want, field))
    assert got.windows() == want.windows()
    with torch.no_grad():
        back = models.load_model(models.resolve(str(out)))(IDS)[0]
    ref = logits(src)
    assert (back - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


def test_rope_nothing_reads_is_refused_in_one_line(tmp_path, monkeypatch, smollm2_dir):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}
    out = write(source(tmp_path, "llama", smollm2_dir, rope_scaling=llama3), tmp_path / "m.gguf", gguf_type="F32")
    with pytest.raises(UserError, match=r"rope_freqs\.weight.*convert the Hugging Face checkpoint instead"):
        gguf_config(out)


class Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


def hf_dict(model_type: str, **kw) -> dict:
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **kw).to_dict()


def test_keys_are_read_for_the_families_llama_cpp_reads_them_for():
    wide = hf_dict("gemma2", num_hidden_layers=46, hidden_size=4608, num_attention_heads=32, head_dim=128)
    assert with_dropped_keys(wide, {})["query_pre_attn_scalar"] == 144  # Gemma 2 27B: llama.cpp's n_embd / n_head
    narrow = hf_dict("gemma2", num_hidden_layers=2, hidden_size=4608, num_attention_heads=32, head_dim=128)
    caps = {"gemma2.attn_logit_softcapping": 20.0, "gemma2.final_logit_softcapping": 10.0}
    out = with_dropped_keys(narrow, caps)
    assert (out["query_pre_attn_scalar"], out["attn_logit_softcapping"], out["final_logit_softcapping"]) == (128, 20.0, 10.0)
    llama = hf_dict("llama")
    assert with_dropped_keys(llama, {"llama.final_logit_softcapping": 5.0}) == llama  # llama.cpp's llama applies no cap
    mistral = hf_dict("mistral")  # transformers maps a "llama" file named Mistral here, with its default window
    assert mistral["sliding_window"] == 4096 and with_dropped_keys(mistral, {})["sliding_window"] is None
    assert with_dropped_keys(hf_dict("qwen3", head_dim=128), {"qwen3.attention.key_length": 64})["head_dim"] == 64
    yarn = {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0, "qwen2.rope.scaling.original_context_length": 64}
    rope = with_dropped_keys(hf_dict("qwen2"), yarn)["rope_parameters"]
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 64)
    phi3 = hf_dict("phi3")
    assert with_dropped_keys(phi3, {"phi3.rope.scaling.type": "linear", "phi3.rope.scaling.factor": 2.0}) == phi3
    with pytest.raises(UserError, match="no qwen2.rope.scaling.factor"):
        with_dropped_keys(hf_dict("qwen2"), {"qwen2.rope.scaling.type": "linear"})


@pytest.mark.parametrize("arch, fields, dropped", [
    ("llama", {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}, []),
    ("llama", {"llama.rope.scaling.type": "none"}, []),
    ("llama", {"llama.rope.scaling.type": "longrope"}, ["llama.rope.scaling.type"]),
    ("qwen2", {"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.attn_factor": 0.8}, ["qwen2.rope.scaling.attn_factor"]),
    ("phi3", {"phi3.rope.scaling.type": "linear"}, ["phi3.rope.scaling.type"]),  # transformers' mapping would drop it
])
def test_scalings_nothing_reads_are_named(arch, fields, dropped):
    reader = SimpleNamespace(tensors=[], fields={k: Field(v) for k, v in {"general.architecture": arch, **fields}.items()})
    assert dropped_rope(reader) == dropped
