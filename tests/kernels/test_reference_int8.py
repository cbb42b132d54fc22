"""The int8 outlier GEMM reference: exact against its own dequantized operands, and within the
quantization bound of the float product."""

import pytest
import torch

from compress.kernels.reference import int8_gemm, int8_outlier_matmul, quantize_per_token_int8
from compress.quant.int8 import split_weight


def operands(m: int, i: int, o: int, k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, i, generator=g)  # [M, I]
    idx = torch.randperm(i, generator=g)[:k].sort().values.to(torch.int32)  # [k]
    x[:, idx.long()] *= 20  # the outlier dims carry large values, as in LLMs
    w = torch.randn(o, i, generator=g) * 0.05  # [O, I]
    return x, w, idx


def quantized_product(x, w, idx):
    q, ws, ow = split_weight(w, idx)
    return int8_outlier_matmul(x, q, ws, idx, ow)


@pytest.mark.parametrize("m,k", [(1, 0), (5, 3), (33, 4)])
def test_matches_dequantized_operands(m, k):
    x, w, idx = operands(m, 60, 24, k)  # I = 60: not a multiple of 8
    q, ws, ow = split_weight(w, idx)
    y = int8_outlier_matmul(x, q, ws, idx, ow)
    xq, xs = quantize_per_token_int8(x.index_fill(1, idx.long(), 0))
    ref = (xq.double() * xs.double()) @ (q.double() * ws.double()).t()  # [M, O]
    ref += x[:, idx.long()].double() @ ow.double().t()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)


def test_within_quantization_bound():
    x, w, idx = operands(17, 64, 32, 4, seed=1)
    q, ws, ow = split_weight(w, idx)
    y = int8_outlier_matmul(x, q, ws, idx, ow)
    rest = x.index_fill(1, idx.long(), 0)
    _, xs = quantize_per_token_int8(rest)
    dx, dw = xs / 2, ws / 2  # [M, 1], [O, 1]: half a quantization step
    w_rest = w.index_fill(1, idx.long(), 0)
    # |xw - x'w'| <= |x| dw + dx |w| + dx dw per term, plus fp16 rounding of the outlier columns
    bound = rest.abs().sum(1, keepdim=True) * dw.t() + dx * w_rest.abs().sum(1)[None] + dx * dw.t() * x.shape[1]
    bound += x[:, idx.long()].abs() @ (w[:, idx.long()].abs() * 2**-11).t()
    err = (y - x @ w.t()).abs()
    assert (err <= bound + 1e-6).all()
    assert err.max() > 0  # the activations really were quantized


def test_no_split_breaks_on_outliers():
    x, w, idx = operands(8, 64, 32, 4, seed=2)
    none = torch.zeros(0, dtype=torch.int32)
    split, plain = (quantized_product(x, w, dims) for dims in (idx, none))
    exact = x @ w.t()
    assert (split - exact).norm() * 4 < (plain - exact).norm()


def test_int8_gemm_is_exact_for_odd_shapes():
    for m, k, n in [(1, 7, 5), (16, 64, 24), (19, 576, 40)]:
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8)
        b = torch.randint(-127, 128, (n, k), dtype=torch.int8)
        assert torch.equal(int8_gemm(a, b.t()), (a.long() @ b.long().t()).int())


def test_keeps_dtype_shape_and_bias():
    x, w, idx = operands(6, 32, 16, 2)
    q, ws, ow = split_weight(w.half(), idx)
    bias = torch.randn(16).half()
    y = int8_outlier_matmul(x.half().view(2, 3, 32), q, ws, idx, ow, bias)
    assert y.shape == (2, 3, 16) and y.dtype == torch.float16
    assert torch.allclose(y.float().view(6, 16), (x @ w.t() + bias.float()), rtol=0.05, atol=0.05)


@pytest.mark.cuda
def test_int8_gemm_pads_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    a = torch.randint(-127, 128, (3, 60), dtype=torch.int8, device="cuda")
    b = torch.randint(-127, 128, (60, 20), dtype=torch.int8, device="cuda")
    assert torch.equal(int8_gemm(a, b).cpu(), (a.cpu().long() @ b.cpu().long()).int())


@pytest.mark.parametrize("m", [1, 4, 5, 300])
def test_int8_gemm_is_exact_on_both_cpu_paths(m):
    g = torch.Generator().manual_seed(m)
    a = torch.randint(-127, 128, (m, 1536), generator=g, dtype=torch.int8)
    b = torch.full((1536, 40), 127, dtype=torch.int8)  # sums up to 1536 * 127^2 > 2^24: fp32 would round
    b[:, 1::2] = torch.randint(-127, 128, (1536, 20), generator=g, dtype=torch.int8)
    assert torch.equal(int8_gemm(a, b), torch._int_mm(a, b))


def test_steps_per_block_of_inputs_round_each_block_by_its_own_max():
    x, w, idx = operands(6, 64, 24, 3, seed=3)
    x[:, :16] *= 50  # one block of large inputs: one step per token would round the other blocks coarsely
    q, ws, ow = split_weight(w, idx)
    y = int8_outlier_matmul(x, q, ws, idx, ow, act_group=16)
    blocks = x.index_fill(1, idx.long(), 0).view(6, 4, 16)  # [M, I/G, G]
    step = blocks.abs().amax(-1, keepdim=True) / 127
    xd = ((blocks / step).round() * step).view(6, 64)
    ref = xd.double() @ (q.double() * ws.double()).t() + x[:, idx.long()].double() @ ow.double().t()
    assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5)
    exact = x @ (q.float() * ws).t() + x[:, idx.long()] @ ow.float().t()  # the weights as stored, x unrounded
    per_token = int8_outlier_matmul(x, q, ws, idx, ow)
    assert (y - exact).norm() * 1.5 < (per_token - exact).norm()  # measured 2.0x
