"""A GGUF's config: what transformers' mapping of the metadata drops (Gemma's attention scale and soft-caps, rope
scaling keys) is read back, so a file reads back as the model it was written from; what nothing reads is refused."""

import json

import pytest
import torch

from compress import models
from compress.errors import UserError
from compress.gguf.metadata import gguf_config
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
