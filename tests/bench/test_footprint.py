"""A decode step's bytes: every weight once for a dense model, the routed share of the experts for a MoE."""

import pytest

from compress.bench.footprint import Footprint, expert_bytes, step_weight_bytes, tensor_bytes
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from tests.conftest import tiny_hf
from tests.families import MOE_FAMILIES


def moe_model():
    hf = tiny_hf("qwen3_moe", **MOE_FAMILIES["qwen3_moe"])
    return load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict()))


def test_a_moe_step_reads_the_routed_share_of_its_experts():
    model = moe_model()
    cfg, experts = model.cfg, expert_bytes(model)
    assert 0 < experts < step_weight_bytes(model)
    fp = Footprint(1000 + experts, 1000 + experts, 10, cfg, (experts, experts))
    share = cfg.moe.top_k / cfg.moe.num_experts
    assert fp.step_bytes(1, 4) == pytest.approx(1000 + experts * share + 40, abs=1)
    assert fp.step_bytes(1, 4) < fp.step_bytes(8, 4) - 70 <= 1000 + experts  # more tokens, more distinct experts


def test_a_dense_step_reads_every_weight():
    fp = Footprint(500, 400, 2)
    assert (fp.step_bytes(3, 10), fp.step_bytes(3, 10, stored=True)) == (460, 560)


def test_expert_bytes_count_only_routed_experts():
    model = moe_model()
    assert expert_bytes(model) == sum(tensor_bytes(b.mlp.experts) for b in model.model.layers if hasattr(b.mlp, "experts"))
