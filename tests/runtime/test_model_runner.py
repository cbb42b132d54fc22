"""Quantized checkpoints through the runtime: the CPU dequantize-once swap, and greedy decoding of exports."""

import pytest
import torch

from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.quant.linear import PackedLinear
from compress.runtime import SamplingParams
from compress.kernels import linear_cpu
from compress.runtime.model_runner import FewRowLinear, cpu_linears
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import make_llm, random_prompts


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


def test_dense_swap_gives_identical_logits(tmp_path, smollm2_dir):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model) == 2 * 7
        after = model(ids)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert torch.equal(before, after)


def test_plain_linears_keep_their_weights_and_few_rows_run_the_kernel(tiny_dir, monkeypatch):
    model = load_model(tiny_dir)
    ids = torch.randint(0, 256, (1, 1))  # one decode row
    weights = {name: p for name, p in model.named_parameters()}
    with torch.no_grad():
        before = model(ids)
        assert cpu_linears(model) == 0
        calls = []
        monkeypatch.setattr(linear_cpu, "linear", lambda *a: calls.append(a) or torch.nn.functional.linear(*a))
        after = model(ids)
    assert all(isinstance(m, FewRowLinear) for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert {name: p for name, p in model.named_parameters()} == weights  # the same tensors, ties kept
    assert len(calls) == (2 * 7 + 1 if linear_cpu.load() is not None else 0)  # every Linear and the lm_head
    torch.testing.assert_close(before, after, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method", ["rtn", "fp8"])
def test_exports_decode_like_their_decoder(tmp_path, smollm2_dir, method):
    out = quantized_dir(tmp_path, smollm2_dir, method)
    prompts = random_prompts([6, 30], 256, seed=5)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    got = [o.token_ids for o in make_llm(out, max_num_batched_tokens=16).generate(prompts, params)]
    model = load_model(out)
    assert got == [greedy_by_full_forward(model, p, 10) for p in prompts]
