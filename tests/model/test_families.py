"""Every family against transformers' own class, on tiny random configs with every feature switched on."""

import json
from dataclasses import replace

import pytest
import torch

from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.model.load import build, load_decoder, load_weights
from tests.conftest import save_hf, tiny_hf
from tests.families import FAMILIES


def ours(hf):
    return load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_logits_equal_transformers_with_every_feature(kind):
    # 24 tokens: past every sliding window (6) and the yarn / longrope original contexts (16)
    hf = tiny_hf(kind, features=True)
    ids = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        want, got = hf(ids).logits, ours(hf)(ids)
    assert (want - got).abs().max().item() <= 1e-4


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_checkpoint_on_disk_loads_lazily_and_matches(kind, tmp_path):
    hf = tiny_hf(kind, features=True, tie_word_embeddings=kind.startswith("gemma"))
    model = load_decoder(save_hf(hf, tmp_path / kind))
    ids = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("kind,key", [("gemma2", "attn_logit_softcapping"), ("gemma2", "final_logit_softcapping"),
                                      ("gemma2", "sliding_window"), ("qwen3", "rope_parameters"), ("phi3", "rope_parameters"),
                                      ("granite", "residual_multiplier"), ("granite", "logits_scaling")])
def test_each_feature_changes_the_logits(kind, key):
    # A feature the decoder ignored would pass the equality test only where it changes nothing.
    hf = tiny_hf(kind, features=True)
    ids = torch.randint(0, 256, (1, 24))
    d = hf.config.to_dict()
    off = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "residual_multiplier": 1.0, "logits_scaling": 1.0}.get(key)
    plain = load_weights(build(ModelConfig.from_hf(d | {key: off})), dict(hf.state_dict())).eval()
    with torch.no_grad():
        assert (ours(hf)(ids) - plain(ids)).abs().max().item() > 1e-3


def test_gemma3_sliding_layers_use_the_local_rope_base():
    cfg = ModelConfig.from_hf(tiny_hf("gemma3_text", features=True).config.to_dict())
    assert [cfg.layer_rope(i) for i in range(2)] == [1, 0]
    assert cfg.local_rope["rope_theta"] == 1e4 and cfg.rope_theta == 1e6


def test_config_round_trips_every_family_key():
    for kind in FAMILIES:
        d = tiny_hf(kind, features=True).config.to_dict()
        first = ModelConfig.from_hf(d)
        again = ModelConfig.from_hf(json.loads(json.dumps(first.to_hf())))
        assert replace(again, extra={}) == replace(first, extra={}), kind


@pytest.mark.parametrize("change,message", [
    ({"model_type": "deepseek_v3"}, "unsupported model_type 'deepseek_v3': supported are"),
    ({"model_type": "gemma3"}, "Gemma 3 multimodal"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "unsupported rope scaling 'dynamic'"),
    ({"mlp_bias": True}, "sets mlp_bias"),
])
def test_unsupported_configs_are_refused_in_one_line(change, message):
    d = tiny_hf("llama").config.to_dict() | change
    with pytest.raises(UserError, match=message) as e:
        ModelConfig.from_hf(json.loads(json.dumps(d)))
    assert "\n" not in str(e.value)
