"""Quantized checkpoints through the runtime: the CPU path's Linear swaps, and greedy decoding of exports."""

import pytest
import torch

from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.quant.linear import PackedLinear
from compress.kernels import linear_cpu, nibble_linear_cpu
from compress.runtime import SamplingParams
from compress.runtime.cpu_linears import NibbleLinear, PanelLinear, cpu_linears
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import make_llm, random_prompts

real_linear = linear_cpu.linear


def quantized_dir(tmp_path, tokenizer_dir, method):
    src = save_hf(tiny_hf("qwen2"), tmp_path / "src", tokenizer_dir)
    model = load_model(src)
    spec = quantize(model, QuantConfig(method=method, bits=4))
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


@pytest.mark.skipif(nibble_linear_cpu.load() is None, reason="no C compiler builds the kernel here")
def test_int4_linears_keep_4_bit_panels_and_give_the_same_logits(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model) == {"4-bit": 2 * 7}
        calls = []
        real = nibble_linear_cpu.linear
        monkeypatch.setattr(nibble_linear_cpu, "linear", lambda *a: calls.append(a) or real(*a))
        after = model(ids)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert sum(isinstance(m, NibbleLinear) for m in model.modules()) == len(calls) == 2 * 7
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)  # the C GEMM sums in its own order


def test_without_the_4_bit_kernel_int4_linears_are_dequantized_into_panels(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    monkeypatch.setattr(nibble_linear_cpu, "supports", lambda scale: False)
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model) == {"dequantized": 2 * 7}
        after = model(ids)
    if linear_cpu.load() is not None:
        assert sum(isinstance(m, PanelLinear) for m in model.modules()) == 2 * 7 + 1  # and the lm_head
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)


def test_every_linear_runs_the_c_gemm_over_packed_panels(tiny_dir, monkeypatch):
    model = load_model(tiny_dir)
    ids = torch.randint(0, 256, (2, 9))
    embedding = model.model.embed_tokens.weight
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model) == {}
        calls = []
        monkeypatch.setattr(linear_cpu, "linear", lambda *a: calls.append(a) or real_linear(*a))
        after = model(ids)
    linears = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, PanelLinear))]
    if linear_cpu.load() is None:  # no compiler: the Linears stay as they were
        assert calls == [] and all(type(m) is torch.nn.Linear for m in linears)
        return
    assert len(linears) == 2 * 7 + 1 and all(isinstance(m, PanelLinear) for m in linears)
    assert len(calls) == 2 * 7 + 1  # every Linear and the lm_head
    assert model.model.embed_tokens.weight is embedding  # the tied table stays for the embedding
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)


def test_without_any_kernel_packed_linears_become_dense_linears(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    monkeypatch.setattr(linear_cpu, "supports", lambda weight: False)
    monkeypatch.setattr(nibble_linear_cpu, "supports", lambda scale: False)
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model) == {"dequantized": 2 * 7}
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
