"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE) against transformers' own classes on tiny random configs."""

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.errors import UserError
from compress.model.arch import ARCHS, expand_groups
from compress.model.config import ModelConfig
from compress.model.load import build, load_decoder, load_weights, open_decoder
from compress.model.moe import SparseMoe, hub_layout
from compress.roofline import param_counts
from tests.conftest import save_hf, tiny_hf
from tests.families import MOE_FAMILIES

CASES = {**{k: (k, {}) for k in MOE_FAMILIES}, "qwen3_moe-no-renorm": ("qwen3_moe", {"norm_topk_prob": False}),
         "qwen2_moe-no-qkv-bias": ("qwen2_moe", {"qkv_bias": False})}


def moe_hf(case: str, **overrides):
    kind, extra = CASES[case]
    return tiny_hf(kind, **MOE_FAMILIES[kind] | extra | overrides)


def ours(hf):
    return load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()


def blocks(model) -> list[SparseMoe]:
    return [m for m in model.modules() if isinstance(m, SparseMoe)]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_equal_transformers(case):
    hf = moe_hf(case)
    ids = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        assert (hf(ids).logits - ours(hf)(ids)).abs().max().item() <= 1e-4


@pytest.mark.parametrize("case", list(CASES))
def test_checkpoint_that_transformers_wrote_loads_lazily_and_matches(case, tmp_path):
    hf = moe_hf(case)
    path = save_hf(hf, tmp_path / case)
    model = load_decoder(path)
    assert set(model.state_dict()) == set(load_file(path / "model.safetensors"))  # the hub's per-expert names, nothing else
    ids = torch.randint(0, 256, (1, 20))
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4


def test_in_memory_fused_experts_become_the_hub_layout(tmp_path):
    hf = moe_hf("mixtral")
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    assert "model.layers.0.mlp.experts.gate_up_proj" in hf.state_dict()  # [E, 2I, C] in memory
    assert hub_layout(dict(hf.state_dict()), cfg).keys() == load_file(save_hf(hf, tmp_path / "m") / "model.safetensors").keys()


def test_sparse_and_dense_layers_as_the_config_says():
    for case, moe_layers in (("qwen2_moe", [1]), ("qwen3_moe", [1]), ("mixtral", [0, 1])):
        cfg = ModelConfig.from_hf(moe_hf(case).config.to_dict())
        model = build(cfg)
        assert [i for i, b in enumerate(model.model.layers) if isinstance(getattr(b, b.ffn), SparseMoe)] == moe_layers
    assert not hasattr(model.model.layers[0], "mlp")  # Mixtral's block is block_sparse_moe


def test_tokens_route_to_different_experts_and_each_expert_runs_once():
    model = ours(moe_hf("qwen3_moe-no-renorm", num_experts=8))
    block = blocks(model)[0]
    calls = [0] * len(block.experts)
    for i, expert in enumerate(block.experts):
        expert.register_forward_hook(lambda m, a, o, i=i: calls.__setitem__(i, calls[i] + 1))
    x = torch.randn(3, 16, 64)
    chosen = block.route(x.reshape(-1, 64))[1]  # [48, 2]
    with torch.no_grad():
        block(x)
    assert len(set(chosen[:, 0].tolist())) > 1
    assert calls == [int(e in chosen) for e in range(8)]


def test_an_expert_nobody_chose_is_never_read():
    model = ours(moe_hf("mixtral"))
    block = blocks(model)[0]
    x = torch.randn(1, 1, 64)
    chosen = set(block.route(x.reshape(-1, 64))[1].flatten().tolist())
    want = block(x)
    with torch.no_grad():
        for e in set(range(4)) - chosen:
            for p in block.experts[e].parameters():
                p.fill_(float("nan"))
    assert len(chosen) == 2 and torch.equal(block(x), want)


def test_names_and_groups_per_expert():
    cfg = ModelConfig.from_hf(moe_hf("qwen2_moe").config.to_dict())
    model = build(cfg)
    layer = model.model.layers[1]
    assert len(layer.linears) == 4 + 3 + 3 * 4  # attention, shared expert, 4 experts
    for name in layer.linears:
        assert isinstance(layer.get_submodule(name), torch.nn.Linear)
    groups = cfg.layer_groups(1)
    assert [len(g.linears) for g in groups] == [3, 1, 2 * 4 + 2 + 2, 1, 1, 1, 1, 1]  # norm -> gates/ups + router + shared gate
    assert groups[3].prev == "mlp.experts.0.up_proj" and groups[3].linears == ("mlp.experts.0.down_proj",)
    assert cfg.layer_groups(0) == ARCHS["qwen2_moe"].scale_groups  # the dense layer
    mixtral = expand_groups(ARCHS["mixtral"].moe.scale_groups, 2)
    assert mixtral[2].linears == ("block_sparse_moe.experts.0.w1", "block_sparse_moe.experts.0.w3",
                                  "block_sparse_moe.experts.1.w1", "block_sparse_moe.experts.1.w3", "block_sparse_moe.gate")


def test_total_and_active_parameters():
    hf = moe_hf("qwen2_moe")
    counts = param_counts(ModelConfig.from_hf(hf.config.to_dict()))
    assert counts["total"] == sum(p.numel() for p in hf.parameters())
    assert counts["total"] - counts["active"] == 1 * (4 - 2) * 3 * 64 * 48  # one sparse layer, 2 of 4 experts unused


def test_config_round_trips():
    for case in CASES:
        first = ModelConfig.from_hf(moe_hf(case).config.to_dict())
        again = ModelConfig.from_hf(json.loads(json.dumps(first.to_hf())))
        assert first.moe is not None and replace(again, extra={}) == replace(first, extra={}), case


@pytest.mark.parametrize("change,message", [
    ({"num_experts_per_tok": 5}, "num_experts_per_tok=5 experts of 4"),
    ({"model_type": "deepseek_v3"}, "unsupported model_type 'deepseek_v3'"),
    ({"model_type": "gpt_oss"}, "unsupported model_type 'gpt_oss'"),
    ({"model_type": "olmoe"}, "unsupported model_type 'olmoe'"),
])
def test_bad_configs_are_refused_in_one_line(change, message):
    d = moe_hf("qwen3_moe").config.to_dict() | change
    with pytest.raises(UserError, match=message) as e:
        ModelConfig.from_hf(json.loads(json.dumps(d)))
    assert "\n" not in str(e.value)


def test_missing_expert_tensor_is_refused_before_reading(tmp_path):
    path = save_hf(moe_hf("mixtral"), tmp_path / "m")
    state = load_file(path / "model.safetensors")
    del state["model.layers.1.block_sparse_moe.experts.3.w2.weight"]
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match="1 tensors missing, e.g. model.layers.1.block_sparse_moe.experts.3.w2.weight") as e:
        open_decoder(path)
    assert "\n" not in str(e.value)


def test_renormalization_changes_the_logits():
    # Both settings equal transformers' above; this shows the switch is not a no-op on these weights.
    hf = moe_hf("qwen3_moe")
    other = load_weights(build(ModelConfig.from_hf(hf.config.to_dict() | {"norm_topk_prob": False})), dict(hf.state_dict()))
    ids = torch.randint(0, 256, (1, 12))
    with torch.no_grad():
        assert (ours(hf)(ids) - other(ids)).abs().max().item() > 1e-3
