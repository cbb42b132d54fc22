"""LLM.int8 on CPU through the int8 row kernels against reference.int8_outlier_matmul."""

import pytest
import torch

import compress.kernels as kernels
from compress.kernels import int8_outlier_cpu, int8_rows_cpu, reference
from tests.kernels.test_int8_matmul import operands
from tests.kernels.tolerance import assert_matches

built = pytest.mark.skipif(int8_rows_cpu.load() is None, reason="no C compiler for int8_rows_cpu")


@built
@pytest.mark.parametrize("m", [1, 7, int8_outlier_cpu.PANEL_ROWS + 3])  # the row kernel and the panel GEMM
@pytest.mark.parametrize("group", [0, 16, 32])
@pytest.mark.parametrize("k", [0, 5])
def test_matches_reference(m, group, k):
    args = operands(m, 37, 96, k)
    assert_matches(int8_outlier_cpu.int8_outlier_matmul(*args, act_group=group),
                   reference.int8_outlier_matmul(*args, act_group=group))


@built
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_comes_back_in_its_dtype(dtype):
    args = operands(3, 40, 64, 4, dtype)
    y = int8_outlier_cpu.int8_outlier_matmul(*args, act_group=32)
    assert y.dtype == dtype
    assert_matches(y, reference.int8_outlier_matmul(*args, act_group=32))


@built
def test_keeps_the_leading_dims_and_the_op_runs_it(monkeypatch):
    x, *rest = operands(6, 24, 64, 2)
    calls = []
    monkeypatch.setattr(int8_outlier_cpu, "int8_outlier_matmul",
                        lambda *a: calls.append(a) or reference.int8_outlier_matmul(*a))
    y = kernels.int8_outlier_matmul(x.view(2, 3, 64), *rest, act_group=16)
    assert y.shape == (2, 3, 24) and len(calls) == 1
    direct = reference.int8_outlier_matmul(x, *rest, act_group=16)
    assert torch.equal(y.view(6, 24), direct)


@built
def test_each_block_of_inputs_takes_its_own_step():
    # one block of a token holds values 1000x the rest: with one step per token the rest round to zero
    x, q, scale, idx, outliers, bias = operands(1, 8, 64, 0)
    x[:, :16] *= 1000
    per_token, grouped = (int8_outlier_cpu.int8_outlier_matmul(x, q, scale, idx, outliers, bias, act_group=g) for g in (0, 16))
    small = x.clone()
    small[:, :16] = 0
    exact_rest = small @ (q.float() * scale.float()).t()  # [1, 8]: what the other blocks contribute
    big = x.clone()
    big[:, 16:] = 0
    tail_per_token = per_token - int8_outlier_cpu.int8_outlier_matmul(big, q, scale, idx, outliers, bias, act_group=0)
    tail_grouped = grouped - int8_outlier_cpu.int8_outlier_matmul(big, q, scale, idx, outliers, bias, act_group=16)
    assert (tail_grouped - exact_rest).abs().max() < 0.05 * exact_rest.abs().max()
    assert (tail_per_token - exact_rest).abs().max() > 0.5 * exact_rest.abs().max()
