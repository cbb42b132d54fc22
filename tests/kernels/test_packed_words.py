"""The word-arithmetic unpacking against the reference's bit planes: the same weights bit for bit."""

import pytest
import torch

from compress import kernels
from compress.kernels import packed_words, reference
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", [IntSpec(4, 32), IntSpec(4, 96, symmetric=True), IntSpec(8, 32), IntSpec(2, 32)])
def test_same_weights_as_the_reference(spec, dtype):
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 40, bias=False).to(dtype)  # 40 rows: the zero points' packed stream ends mid-word
    p = PackedLinear.from_float(lin, spec)
    args = (p.weight_packed, p.weight_scale, p.weight_zero_point, spec.bits, 96)
    w = packed_words.dequantize_packed(*args)
    assert w.dtype == dtype and torch.equal(w, reference.dequantize_packed(*args))
    x = torch.randn(3, 96).to(dtype)
    assert torch.equal(packed_words.dequant_matmul(x, *args[:4]), reference.dequant_matmul(x, *args[:4]))


def test_the_ops_take_it_where_codes_fit_words_and_the_reference_elsewhere(monkeypatch):
    calls = []
    monkeypatch.setattr(packed_words, "dequantize_packed", lambda *a: calls.append("words") or reference.dequantize_packed(*a))
    lin = torch.nn.Linear(64, 8, bias=False)
    for bits, expected in ((4, ["words"]), (3, [])):
        calls.clear()
        p = PackedLinear.from_float(lin, IntSpec(bits, 32))
        kernels.dequantize_packed(p.weight_packed, p.weight_scale, p.weight_zero_point, bits, 64)
        assert calls == expected
