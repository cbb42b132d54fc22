"""q/k/v and gate/up joined into one Linear each on the CPU path: the same logits, fewer calls."""

import pytest
import torch
from torch import nn

from compress.kernels import linear_cpu, nibble_linear_cpu, nibble_q8_cpu
from compress.models import load_model
from compress.runtime.cpu_fusion import join_projections, joinable, joined, widened
from compress.runtime.cpu_linears import cpu_linears, swap_gguf
from compress.runtime.cpu_modules import ByteLinear, CpuLinear, FiveLinear, NibbleLinear, Scratch
from tests.runtime.test_cpu_linears import q5_0_linear
from tests.runtime.test_model_runner import quantized_dir, set_kernel


def set_all(model, use_c: bool) -> None:
    set_kernel(model, use_c)
    for m in model.modules():
        if isinstance(m, NibbleLinear):
            m.use_c = [use_c]


@pytest.mark.skipif(nibble_linear_cpu.load() is None, reason="no C compiler builds the kernel here")
def test_int4_projections_join_and_give_the_same_logits(tmp_path, smollm2_dir):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))  # qwen2: q, k and v have biases
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids)
        cpu_linears(model)
        assert join_projections(model) == 2 * 2
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        assert isinstance(attn.qkv, NibbleLinear) and attn.qkv.bias is not None and not hasattr(attn, "q_proj")
        assert isinstance(mlp.gate_up, NibbleLinear) and mlp.gate_up.out_features == 2 * mlp.down_proj.in_features
        set_all(model, True)
        after_c = model(ids)
        set_all(model, False)
        after_torch = model(ids)
    torch.testing.assert_close(after_c, before, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after_torch, before, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(linear_cpu.load() is None, reason="no C compiler builds the kernel here")
def test_fp32_projections_join_and_unjoinable_ones_stay(tiny_dir):
    model = load_model(tiny_dir)
    ids = torch.randint(0, 256, (1, 7))
    with torch.no_grad():
        before = model(ids)
        cpu_linears(model)
        first = model.model.layers[0].self_attn
        first.k_proj = nn.Linear(first.k_proj.in_features, first.k_proj.out_features)  # a Linear left to torch
        first.k_proj.weight.data = model.model.layers[0].self_attn.v_proj.weight.detach().clone()
        first.k_proj.bias.data.zero_()
        expected = model(ids)
        assert join_projections(model) == 2 * 2 - 1  # every join but the first block's q/k/v
        assert first.qkv is None and isinstance(first.k_proj, nn.Linear)
        assert isinstance(model.model.layers[1].self_attn.qkv, CpuLinear)
        after = model(ids)
    torch.testing.assert_close(after, expected, atol=1e-5, rtol=1e-5)
    assert not torch.equal(expected, before)  # the replaced k_proj did change the model


@pytest.mark.skipif(nibble_q8_cpu.load() is None, reason="no int8-activation kernel here")
def test_projections_whose_scales_are_held_differently_do_not_join():
    def held(scale_dtype_exact: bool) -> NibbleLinear:
        codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
        scale = torch.rand(8, 2) + 0.5
        scale = scale.half().float() if scale_dtype_exact else scale
        packed = nibble_linear_cpu.pack(codes, scale, torch.full((8, 2), 8, dtype=torch.int32))
        return NibbleLinear(dict(zip(NibbleLinear.NAMES, packed)), None, Scratch(), int8_activations=True)

    q4_0, wide = held(True), held(False)
    assert (q4_0.form, wide.form) == ("fp16 symmetric", "fp32")
    assert joinable([q4_0, held(True)]) and not joinable([q4_0, wide])
    assert joined([q4_0, held(True)]).form == "fp16 symmetric"


@pytest.mark.skipif(nibble_q8_cpu.load() is None, reason="no int8-activation kernel here")
def test_q5_0_projections_join_as_they_are_or_as_bytes_beside_a_q8_0():
    """All Q5_0 (gate/up): one FiveLinear. Q5_0 q/k beside a Q8_0 v (Q4_K_M's rule for some layers): widened to bytes
    and one ByteLinear, since the C decode step needs q/k/v as one Linear. The joined outputs are the parts'."""
    q, k, v = (swap_gguf(q5_0_linear(rows, 128, seed=rows), Scratch(), True) for rows in (64, 32, 32))
    v8 = ByteLinear({"codes": torch.randint(-127, 128, (32, 128), dtype=torch.int8), "scales": torch.rand(32, 4)}, None, Scratch())
    x = torch.randn(3, 128)
    for parts, kind in (([q, k, v], FiveLinear), (widened([q, k, v8]), ByteLinear)):
        assert joinable(parts)
        one = joined(parts)
        assert type(one) is kind and one.out_features == 128
        torch.testing.assert_close(one(x), torch.cat([p(x) for p in (q, k, parts[2])], dim=-1), rtol=1e-5, atol=1e-5)
    assert widened([q, k, v]) == [q, k, v]  # nothing widened where all are Q5_0
