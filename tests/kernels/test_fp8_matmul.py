"""fp8 e4m3 scaled matmul against reference.fp8_matmul (interpreter on CPU)."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.quant.fp8 import input_scale, quantize_weight
from tests.kernels.conftest import cuda_only
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.fp8_matmul")


def operands(m, o, i, static, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    weight, scale = quantize_weight(torch.randn(o, i, generator=g))  # e4m3 [O, I], [O, 1]
    x = torch.randn(m, i, generator=g)  # [M, I]
    x_scale = input_scale(x.abs().amax(0), torch.float32).to(device) if static else None
    bias = torch.randn(o, generator=g).to(dtype)
    return x.to(dtype).to(device), weight.to(device), scale.to(device), bias.to(device), x_scale


@pytest.mark.parametrize("static", [False, True])  # per-token dynamic, per-tensor input_scale
@pytest.mark.parametrize("m", [1, 19])
def test_matches_reference(m, static, device):
    args = operands(m, 37, 96, static, device=device)
    assert_matches(kernel.fp8_matmul(*args), reference.fp8_matmul(*args))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, device):
    args = operands(5, 40, 64, False, dtype, device)
    assert_matches(kernel.fp8_matmul(*args), reference.fp8_matmul(*args))


def test_rejects_bad_inputs():
    x, weight, scale, bias, _ = operands(2, 8, 32, False)
    with pytest.raises(ValueError, match="weight must be torch.float8_e4m3fn"):
        kernel.fp8_matmul(x, weight.float(), scale, bias)
    with pytest.raises(ValueError, match="weight_scale must have shape"):
        kernel.fp8_matmul(x, weight, scale.view(-1), bias)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("m", [1, 64])
def test_llama_shape_on_gpu(m):
    args = operands(m, 4096, 4096, False, torch.float16, "cuda")
    assert_matches(kernel.fp8_matmul(*args), reference.fp8_matmul(*args))
