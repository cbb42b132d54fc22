"""compress.kernels exposes each op as a function that runs the reference on CPU tensors."""

import importlib
import math

import torch

import compress.kernels as kernels
from compress.kernels import paged_attention_cpu, reference

OPS = ["dequant_matmul", "dequantize_packed", "int8_outlier_matmul", "fp8_matmul", "paged_attention"]


def test_ops_are_functions_even_after_importing_their_kernel_modules():
    for name in ["dequant_matmul", "fp8_matmul", "paged_attention", "int8_matmul"]:
        importlib.import_module(f"compress.kernels.{name}")
    assert all(callable(getattr(kernels, op)) for op in OPS)


def test_cpu_tensors_take_the_reference_path():
    q = torch.randn(2, 4, 16, dtype=torch.float64)  # [S, H, D]; fp64: not the C kernel's dtype
    cache = torch.randn(4, 16, 2, 16, dtype=torch.float64)  # [blocks, block_size, KVH, D]
    args = (q, cache, cache, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32))
    assert torch.equal(kernels.paged_attention(*args), reference.paged_attention(*args))


def test_fp32_cpu_attention_takes_the_c_kernel_where_it_builds(monkeypatch):
    q, cache = torch.randn(2, 4, 16), torch.randn(4, 16, 2, 16)
    args = (q, cache, cache, torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), torch.tensor([20, 7], dtype=torch.int32))
    calls = []
    monkeypatch.setattr(paged_attention_cpu, "paged_attention", lambda *a: calls.append(a) or reference.paged_attention(*a))
    kernels.paged_attention(*args)
    assert len(calls) == (paged_attention_cpu.load() is not None)


def test_dequant_matmul_runs_the_op_fused_dequant_picks(monkeypatch):
    kernel = importlib.import_module("compress.kernels.dequant_matmul")
    calls = []
    monkeypatch.setattr(kernel, "dequant_matmul", lambda *a: calls.append("fused"))
    monkeypatch.setattr(reference, "dequant_matmul", lambda *a: calls.append("dense"))
    for fused in (True, False):
        monkeypatch.setattr(kernels, "fused_dequant", lambda x, fused=fused: fused)
        kernels.dequant_matmul(torch.randn(2, 64), None, None, None, 4)
    assert calls == ["fused", "dense"]


class FakeCuda:
    """What fused_dequant reads of a tensor, for a CUDA tensor of the given shape."""

    is_cuda = True

    def __init__(self, *shape):
        self.shape = shape

    def numel(self):
        return math.prod(self.shape)


def test_dequant_matmul_fuses_only_few_cuda_rows():
    assert kernels.fused_dequant(FakeCuda(1, 576))
    assert kernels.fused_dequant(FakeCuda(3, 85, 576))  # 255 rows over two leading dims
    assert not kernels.fused_dequant(FakeCuda(kernels.DEQUANT_GEMM_MIN_ROWS, 576))
    assert not kernels.fused_dequant(FakeCuda(2, 2048, 576))  # a perplexity batch: dequantize once, dense GEMM
    assert not kernels.fused_dequant(torch.randn(1, 576))
