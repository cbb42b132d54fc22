"""Quantized checkpoints through the runtime: the CPU path's Linear swaps, and greedy decoding of exports."""

import pytest
import torch

from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.quant.linear import PackedLinear
from compress.kernels import linear_cpu, nibble_linear_cpu, nibble_panel_cpu
from compress.runtime import SamplingParams
from compress.runtime.cpu_linears import cpu_linears
from compress.runtime.cpu_modules import CpuLinear, NibbleLinear
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import make_llm, random_prompts

real_linear, real_nibble, real_panel = linear_cpu.unchecked, nibble_linear_cpu.unchecked, nibble_panel_cpu.unchecked


def quantized_dir(tmp_path, tokenizer_dir, method):
    src = save_hf(tiny_hf("qwen2"), tmp_path / "src", tokenizer_dir)
    model = load_model(src)
    # fp8 rounded to nearest: its default GPTQ rounding calibrates, which this decode test does not need
    spec = quantize(model, QuantConfig(method=method, bits=4, **({"rounding": "nearest"} if method == "fp8" else {})))
    out = tmp_path / method
    out.mkdir()
    write_quantized(model, spec, out, src)
    return out


def greedy_by_full_forward(model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def set_kernel(model, use_c: bool) -> None:
    """Every swapped Linear on one kernel at every row count."""
    for m in model.modules():
        if isinstance(m, (CpuLinear, NibbleLinear)):
            m.use_c = [use_c]


@pytest.mark.skipif(nibble_linear_cpu.load() is None, reason="no C compiler builds the kernel here")
def test_int4_linears_keep_4_bits_and_both_kernels_give_the_same_logits(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids)
        swapped = cpu_linears(model)
        nibbles = [m for m in model.modules() if isinstance(m, NibbleLinear)]
        assert swapped.dequantized == 0 and len(nibbles) == 2 * 7 and not any(isinstance(m, PackedLinear) for m in model.modules())
        assert len({id(m.scratch) for m in nibbles}) == 1  # one scratch buffer for all
        calls = []
        monkeypatch.setattr(nibble_linear_cpu, "unchecked", lambda *a: calls.append(a) or real_nibble(*a))
        set_kernel(model, True)
        after_c = model(ids)
        assert len(calls) == 2 * 7 and nibbles[0].scratch.buffer.numel() == 0  # the C path needs no scratch
        set_kernel(model, False)
        after_torch = model(ids)
        scratch = nibbles[0].scratch.buffer
        panel_calls = []
        monkeypatch.setattr(nibble_panel_cpu, "unchecked", lambda *a: panel_calls.append(a) or real_panel(*a))
        for m in nibbles:
            m.use_panel = [True]  # dequantized into the panel GEMM's panels
        after_panel = model(ids)
    assert len(calls) == 2 * 7 and scratch.numel() == max(m.out_features * m.in_features for m in nibbles)
    assert len(panel_calls) == 2 * 7 and nibbles[0].scratch.buffer is scratch  # the panel path takes no scratch
    torch.testing.assert_close(before, after_c, atol=1e-5, rtol=1e-5)  # the C GEMM sums in its own order
    torch.testing.assert_close(before, after_torch, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(before, after_panel, atol=1e-5, rtol=1e-5)


def test_without_the_4_bit_kernel_int4_linears_are_dequantized_once(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    monkeypatch.setattr(nibble_linear_cpu, "supports", lambda scale, in_features: False)
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model).dequantized == 2 * 7
        after = model(ids)
    if linear_cpu.load() is not None:
        assert sum(isinstance(m, CpuLinear) for m in model.modules()) == 2 * 7 + 1  # and the lm_head
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)


def test_fp32_linears_keep_their_own_weights_and_run_either_kernel(tiny_dir, monkeypatch):
    model = load_model(tiny_dir)
    ids = torch.randint(0, 256, (2, 9))
    weights = {name: m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    with torch.no_grad():
        before = model(ids)
        swapped = cpu_linears(model)
        if linear_cpu.load() is None:  # no compiler: the Linears stay as they were
            assert swapped.groups == [] and all(type(model.get_submodule(n)) is torch.nn.Linear for n in weights)
            return
        calls = []
        monkeypatch.setattr(linear_cpu, "unchecked", lambda *a: calls.append(a) or real_linear(*a))
        set_kernel(model, True)
        after_c = model(ids)
        assert len(calls) == 2 * 7 + 1  # every Linear and the lm_head
        set_kernel(model, False)
        after_torch = model(ids)
    assert len(calls) == 2 * 7 + 1
    assert all(isinstance(model.get_submodule(n), CpuLinear) and model.get_submodule(n).weight is w for n, w in weights.items())
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tied table, not a copy
    assert [g.op for g in swapped.groups] == ["linear 64x64 fp32", "linear 32x64 fp32", "linear 128x64 fp32",
                                              "linear 64x128 fp32", "linear 49152x64 fp32"]
    torch.testing.assert_close(before, after_c, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(before, after_torch, atol=1e-5, rtol=1e-5)


def test_without_any_kernel_packed_linears_become_dense_linears(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    monkeypatch.setattr(linear_cpu, "supports", lambda weight: False)
    monkeypatch.setattr(nibble_linear_cpu, "supports", lambda scale, in_features: False)
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model).dequantized == 2 * 7
        after = model(ids)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, (torch.nn.Linear, PackedLinear)))
    assert torch.equal(before, after)  # the reference path computes x @ dequant(W)^T: the same op


@pytest.mark.parametrize("method", ["rtn", "fp8"])
def test_exports_decode_like_their_decoder(tmp_path, smollm2_dir, method):
    out = quantized_dir(tmp_path, smollm2_dir, method)
    prompts = random_prompts([6, 30], 256, seed=5)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    got = [o.token_ids for o in make_llm(out, max_num_batched_tokens=16).generate(prompts, params)]
    model = load_model(out)
    assert got == [greedy_by_full_forward(model, p, 10) for p in prompts]
