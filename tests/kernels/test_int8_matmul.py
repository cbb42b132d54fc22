"""Fused LLM.int8 outlier matmul against reference.int8_outlier_matmul (interpreter on CPU)."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.quant.int8 import split_weight
from tests.kernels.conftest import cuda_only
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.int8_matmul")


def operands(m, o, i, k, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(i, generator=g)[:k].sort().values.int()  # [k]
    q, scale, outliers = split_weight(torch.randn(o, i, generator=g), idx)
    x = torch.randn(m, i, generator=g)  # [M, I]
    x[:, idx.long()] *= 20  # outlier dims carry large values
    bias = torch.randn(o, generator=g)
    args = (x.to(dtype), q, scale, idx, outliers.to(dtype), bias.to(dtype))
    return tuple(t.to(device) for t in args)


@pytest.mark.parametrize("k", [0, 3, 20])  # outlier dims; 20 > one 16-wide outlier tile
@pytest.mark.parametrize("m", [1, 19])
def test_matches_reference(m, k, device):
    args = operands(m, 37, 96, k, device=device)
    assert_matches(kernel.int8_outlier_matmul(*args), reference.int8_outlier_matmul(*args))


@pytest.mark.parametrize("m", [1, 19])
@pytest.mark.parametrize("group", [16, 32])
def test_steps_per_block_of_inputs_match_reference(m, group, device):
    args = operands(m, 37, 96, 5, device=device)
    assert_matches(kernel.int8_outlier_matmul(*args, act_group=group), reference.int8_outlier_matmul(*args, act_group=group))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, device):
    args = operands(5, 40, 64, 4, dtype, device)
    assert_matches(kernel.int8_outlier_matmul(*args), reference.int8_outlier_matmul(*args))


def test_rejects_bad_inputs():
    x, q, scale, idx, outliers, bias = operands(2, 8, 32, 2)
    with pytest.raises(ValueError, match="weight must be torch.int8"):
        kernel.int8_outlier_matmul(x, q.float(), scale, idx, outliers, bias)
    with pytest.raises(ValueError, match="outlier_weight must have shape"):
        kernel.int8_outlier_matmul(x, q, scale, idx, outliers[:, :1], bias)
    with pytest.raises(ValueError, match="outlier_idx must be"):
        kernel.int8_outlier_matmul(x, q, scale, idx.long(), outliers, bias)
    with pytest.raises(ValueError, match="act_group must be"):
        kernel.int8_outlier_matmul(x, q, scale, idx, outliers, bias, act_group=24)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("m", [1, 64])
def test_llama_shape_on_gpu(m):
    args = operands(m, 4096, 4096, 24, torch.float16, "cuda")
    assert_matches(kernel.int8_outlier_matmul(*args), reference.int8_outlier_matmul(*args))
