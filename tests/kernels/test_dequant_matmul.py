"""Fused int4/int3 dequant matmul against reference.dequant_matmul (interpreter on CPU)."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.quant.packing import pack, pack_zero_points
from tests.kernels.conftest import cuda_only
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.dequant_matmul")


def operands(m, o, i, group, bits, symmetric, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    packed = pack(torch.randint(0, 2**bits, (o, i), generator=g), bits)  # [O, ceil(I*b/32)]
    scale = (torch.rand(o, i // group, generator=g) * 0.1 + 0.01).to(dtype)  # [O, G]
    zero = None if symmetric else pack_zero_points(torch.randint(0, 2**bits, (o, i // group), generator=g), bits)
    x = torch.randn(m, i, generator=g).to(dtype)  # [M, I]
    bias = torch.randn(o, generator=g).to(dtype)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(x), to(packed), to(scale), to(zero), to(bias)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("m", [3, 17])  # split-K GEMV, tiled GEMM; odd M
def test_matches_reference(m, bits, group, symmetric, device):
    x, packed, scale, zero, bias = operands(m, 37, 256, group, bits, symmetric, device=device)  # O = 37: not a tile multiple
    assert_matches(kernel.dequant_matmul(x, packed, scale, zero, bits, bias),
                   reference.dequant_matmul(x, packed, scale, zero, bits, bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 20])
def test_half_precision(m, dtype, device):
    x, packed, scale, zero, bias = operands(m, 40, 128, 64, 4, False, dtype, device)
    assert_matches(kernel.dequant_matmul(x, packed, scale, zero, 4, bias),
                   reference.dequant_matmul(x, packed, scale, zero, 4, bias))


def test_batched_input_without_bias(device):
    x, packed, scale, zero, _ = operands(6, 33, 64, 32, 3, False, device=device)
    x = x.view(2, 3, 64)
    y = kernel.dequant_matmul(x, packed, scale, zero, 3)
    assert y.shape == (2, 3, 33)
    assert_matches(y, reference.dequant_matmul(x, packed, scale, zero, 3))


@pytest.mark.parametrize("change,message", [
    (dict(bits=2), "bits must be 3 or 4"),
    (dict(packed=torch.zeros(37, 31, dtype=torch.int32)), "weight_packed must have shape"),
    (dict(zero=torch.zeros(4, 2, dtype=torch.int32)), "weight_zero_point must have shape"),
    (dict(scale=torch.ones(37, 3)), "group size"),
    (dict(bias=torch.ones(36)), "bias must have shape"),
])
def test_rejects_bad_inputs(change, message):
    x, packed, scale, zero, bias = operands(2, 37, 128, 64, 4, False)
    args = dict(x=x, packed=packed, scale=scale, zero=zero, bits=4, bias=bias) | change
    with pytest.raises(ValueError, match=message):
        kernel.dequant_matmul(args["x"], args["packed"], args["scale"], args["zero"], args["bits"], args["bias"])


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("bits", [3, 4])
def test_llama_shape_on_gpu(m, bits):
    x, packed, scale, zero, bias = operands(m, 4096, 4096, 128, bits, False, torch.float16, "cuda")
    assert_matches(kernel.dequant_matmul(x, packed, scale, zero, bits, bias),
                   reference.dequant_matmul(x, packed, scale, zero, bits, bias))
