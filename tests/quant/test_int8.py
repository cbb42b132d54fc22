"""int8 with calibrated outlier dims: detection, the split's benefit, export and reload."""

import json

import pytest
import torch

from compress.calib import record_absmax
from compress.errors import UserError
from compress.model.arch import LAYER_LINEARS
from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.quant.int8 import Int8Spec, outlier_dims
from compress.quant.linear import Int8OutlierLinear
from compress.quant.static_apply import int8_quantize, smooth_block
from tests.conftest import save_hf, tiny_hf

PLANTED = {0: [3, 17, 40], 1: [9, 50]}  # layer -> hidden dims whose norm weight is scaled up
NORM_FED = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")


def planted_model(tmp_path):
    """A tiny Llama whose norms make the planted hidden dims ~30x larger than the others."""
    hf = tiny_hf("llama")
    with torch.no_grad():
        for layer, dims in PLANTED.items():
            for norm in ("input_layernorm", "post_attention_layernorm"):
                getattr(hf.model.layers[layer], norm).weight[dims] *= 30
    return save_hf(hf, tmp_path / "src")


def calib_tokens(n: int = 4, t: int = 32) -> torch.Tensor:
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(0))


def test_outlier_dims_threshold_and_topk():
    absmax = torch.tensor([1.0, 7.0, 6.0, 0.5, 30.0])
    assert outlier_dims(absmax, Int8Spec(6.0, None)).tolist() == [1, 2, 4]
    assert outlier_dims(absmax, Int8Spec(6.0, 2)).tolist() == [1, 4]
    assert outlier_dims(None, Int8Spec(6.0, 0)).tolist() == []
    assert outlier_dims(absmax, Int8Spec(6.0, None)).dtype == torch.int32


def test_calibration_finds_planted_dims(tmp_path):
    model = load_model(planted_model(tmp_path))
    stats = int8_quantize(model, Int8Spec(6.0, None), calib_tokens())
    for i, block in enumerate(model.model.layers):
        for name in NORM_FED:
            assert block.get_submodule(name).outlier_idx.tolist() == PLANTED[i], (i, name)
        assert block.self_attn.o_proj.outlier_idx.numel() == 0, i  # fed by attention, not by a norm
        # (down_proj's input, gate * up, inherits large values from the planted dims: not asserted)
    assert stats["model.layers.0.self_attn.q_proj"].shape == (64,)


def relative_errors(tmp_path, configs: dict) -> dict:
    """{key: the planted model's relative logit error quantized by configs[key]}."""
    src = planted_model(tmp_path)
    fp = load_model(src)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    errors = {}
    for key, cfg in configs.items():
        model = load_model(src)
        quantize(model, cfg, calib_tokens() if cfg.needs_calibration else None)
        with torch.no_grad():
            errors[key] = ((model(ids) - fp(ids)).norm() / fp(ids).norm()).item()
    return errors


def test_steps_per_block_of_inputs_beat_one_per_token(tmp_path):
    errors = relative_errors(tmp_path, {g: QuantConfig(method="int8", outlier_topk=0, smooth_alpha=0.0, act_group_size=g)
                                        for g in (0, 16)})
    assert errors[16] * 1.3 < errors[0], errors  # measured 1.5x: without a split the planted dims coarsen only their blocks


def test_act_group_size_must_divide_every_linear(tmp_path):
    with pytest.raises(UserError, match="--act-group-size 128 does not divide"):
        quantize(load_model(planted_model(tmp_path)), QuantConfig(method="int8", smooth_alpha=0.0, act_group_size=128))


def test_default_steps_are_the_widest_block_dividing_every_linear(tmp_path):
    model = load_model(planted_model(tmp_path))
    quantize(model, QuantConfig(method="int8"), calib_tokens())
    q = model.model.layers[0].self_attn.q_proj
    assert q.act_group == 32 and q.in_features == 64


def test_default_steps_refuse_widths_no_block_divides(tmp_path):
    hf = tiny_hf("llama", intermediate_size=120)  # down_proj's 120 inputs: 8 x 15, neither 32 nor 16 divides
    with pytest.raises(UserError, match="--act-group-size 32 or 16 does not divide .*pass --act-group-size 0"):
        quantize(load_model(save_hf(hf, tmp_path / "src")), QuantConfig(method="int8"), calib_tokens())


def test_split_beats_no_split(tmp_path):
    errors = relative_errors(tmp_path, {k: QuantConfig(method="int8", outlier_topk=k, smooth_alpha=0.0, act_group_size=0)
                                        for k in (None, 0)})
    assert errors[None] * 2 < errors[0], errors


@pytest.mark.parametrize("group", [0, 16])
def test_export_reload_same_logits(tmp_path, group):
    src = planted_model(tmp_path)
    model = load_model(src)
    spec = quantize(model, QuantConfig(method="int8", smooth_alpha=0.0, act_group_size=group), calib_tokens())
    out = tmp_path / "out"
    out.mkdir()
    write_quantized(model, spec, out, src)
    reloaded = load_model(out)
    q = reloaded.model.layers[1].mlp.up_proj
    assert isinstance(q, Int8OutlierLinear) and q.outlier_idx.tolist() == PLANTED[1] and q.act_group == group
    steps = json.loads((out / "config.json").read_text())["quantization_config"]["input_activations"]
    assert steps["strategy"] == ("group" if group else "token") and steps.get("group_size", 0) == group
    assert q.weight.dtype == torch.int8 and q.outlier_weight.dtype == torch.float16
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        assert torch.equal(model(ids), reloaded(ids))


def test_smoothing_folds_exactly_and_rescales_the_statistics(tmp_path):
    model = load_model(planted_model(tmp_path))
    block = model.model.layers[0]
    x = torch.randn(2, 12, model.cfg.hidden_size, generator=torch.Generator().manual_seed(2))  # [N, T, C]
    model.prepare(torch.arange(12)[None], x.dtype)
    with torch.no_grad():
        before = block(x)
    absmax = record_absmax(block, x, list(LAYER_LINEARS))
    smooth_block(0.5)(block, absmax, model.cfg.layer_groups(0))
    with torch.no_grad():
        assert torch.allclose(block(x), before, atol=1e-5, rtol=1e-5)
    seen = record_absmax(block, x, list(LAYER_LINEARS))
    for name in LAYER_LINEARS:
        assert torch.allclose(seen[name], absmax[name], rtol=1e-5), name
    planted = absmax["self_attn.q_proj"][PLANTED[0]].min() / absmax["self_attn.q_proj"].median()
    assert planted < 10  # was ~30x before smoothing


def test_smoothing_beats_plain_int8_without_a_split(tmp_path):
    errors = relative_errors(tmp_path, {a: QuantConfig(method="int8", outlier_threshold=1e9, smooth_alpha=a, act_group_size=0)
                                        for a in (0.0, 0.5)})
    assert errors[0.5] * 1.5 < errors[0.0], errors
