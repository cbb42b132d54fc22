"""The byte-code CPU GEMM on int8 activations (a GGUF's Q5_0 / Q6_K / Q8_0 codes) against x rounded as the kernel
rounds it times s * C, in each x86 build."""

import importlib

import pytest
import torch

from compress.kernels import reference
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.byte_q8_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler or no AVX2 for the kernel here")


def random_weight(out_features: int, in_features: int, group: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (out_features, in_features), generator=g, dtype=torch.int8)
    codes[0, :32] = -128  # |-128| is 128 only read unsigned: the sign trick's edge
    scale = torch.randn(out_features, in_features // group, generator=g)  # either sign, as ggml's d
    return codes, scale


def rounded(x, group: int) -> torch.Tensor:
    """x as the kernel rounds it for a weight of this group size: as ggml's activations for Q6_K (16: per 256 inputs
    where they divide I) and Q8_0 (32: fp16 steps), per 32 in fp32 otherwise."""
    if group == 16 and x.shape[-1] % 256 == 0:
        return reference.round_blocks_int8(x, 256, "reciprocal")
    return reference.round_blocks_int8(x, 32, "fp16" if group == 32 else "fp32")


def emulated(x, codes, scale, bias=None):
    group = codes.shape[1] // scale.shape[1]
    w = (codes.double().unflatten(1, (scale.shape[1], -1)) * scale.double()[..., None]).flatten(1)  # [O, I]
    y = torch.nn.functional.linear(rounded(x, group).double(), w, None if bias is None else bias.double())
    return y.float()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 13])  # whole and partial 4-row tiles
@pytest.mark.parametrize("out_features", [36, 29])  # whole 4- and 2-row tiles, and a ragged last one
@pytest.mark.parametrize("group", [16, 32, 64])  # 16: Q6_K, two scales in one 32-byte load; 32: Q5_0 / Q8_0
def test_matches_the_emulation_in_each_build(isa, rows, out_features, group):
    in_features = 512 if group == 16 else 192  # Q6_K's x per 256 inputs where they divide I
    codes, scale = random_weight(out_features, in_features, group, seed=rows)
    x, b = torch.randn(rows, 1, in_features), torch.randn(out_features)
    x[0, 0, :32] = 0  # a block of zeros: its scale is 0, not a division by 0
    x[-1, 0, 70] = 50.0  # an outlier: its block's other inputs round coarsely, the same in both
    assert_matches(kernel.linear(x, (codes, scale), b), emulated(x, codes, scale, b))
    assert_matches(kernel.linear(x, (codes, scale)), emulated(x, codes, scale))


@needs_kernel
def test_error_against_fp32_is_that_of_8_bit_inputs():
    codes, scale = random_weight(64, 576, 32, seed=0)
    x = torch.randn(4, 576)
    w = kernel.dequantize((codes, scale))
    exact = x.double() @ w.double().T
    err = ((kernel.linear(x, (codes, scale)).double() - exact).norm() / exact.norm()).item()
    assert 1e-4 < err < 0.02  # rounded (not fp32), and only by x's 8-bit steps


def test_dequantize_into_a_buffer():
    codes, scale = random_weight(8, 64, 16, seed=1)
    out = torch.full((8 * 64 + 5,), float("nan"))
    w = kernel.dequantize((codes, scale), out)
    assert torch.equal(w, codes.float() * scale.repeat_interleave(16, 1))
    assert w.data_ptr() == out.data_ptr()


def test_shapes_it_cannot_run_are_refused():
    codes, scale = random_weight(8, 96, 32, seed=0)
    assert not kernel.supports(torch.zeros(8, 2), 96)  # groups of 48: not 16, 32 or a multiple of 32
    with pytest.raises(ValueError, match="groups of 16, 32"):
        kernel.linear(torch.randn(1, 96), (codes, torch.zeros(8, 2)))
    with pytest.raises(ValueError, match="torch.int8"):
        kernel.linear(torch.randn(1, 96), (codes.to(torch.uint8), scale))
    with pytest.raises(ValueError, match="end in 96"):
        kernel.linear(torch.randn(1, 64), (codes, scale))
