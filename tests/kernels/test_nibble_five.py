"""Q5_0 held in 5.5 bits a weight (nibbles, a plane of fifth bits, fp16 scales): its layout against ggml's codes, and
the int8-activation kernel's 5-bit entry against x rounded per block of 32 times the exact weight, in each x86 build."""

import importlib

import pytest
import torch

from compress.kernels import nibble_forms, reference
from tests.kernels.tolerance import assert_matches

five = importlib.import_module("compress.kernels.nibble_five")
q8 = importlib.import_module("compress.kernels.nibble_q8_cpu")
needs_kernel = pytest.mark.skipif(q8.load() is None, reason="no C compiler or no AVX2 for the kernel here")


def q5_0(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's unsigned codes [O, I] in [0, 32) and d [O, I/32] of either sign, fp16 values."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 32, (out_features, in_features), generator=g)
    d = (torch.randn(out_features, in_features // 32, generator=g) * 0.02).half().float()
    return codes, d


def weight(codes: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return ((codes - 16).float().view(codes.shape[0], d.shape[1], 32) * d[..., None]).view(codes.shape)  # [O, I]


def test_the_fifth_bits_sit_where_the_kernel_reads_them():
    codes = torch.zeros(1, 128, dtype=torch.int64)
    codes[0, 16] = 16  # block 0, chunk 0, high nibble of byte 0: the second mask's bit 0
    codes[0, 33] = 16  # chunk 1, low nibble of byte 17: the first mask's bit 17
    codes[0, 64 + 63] = 31  # block 1, chunk 1, high nibble of byte 31: its second mask's bit 31
    low, _, high = five.pack(codes, torch.ones(1, 4))
    assert high.tolist() == [[0, 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 128]]
    assert low[0, 63].item() == 15 << 4  # input 127: byte 15 of chunk 3, high nibble; its low 4 bits stay there


def test_codes_and_weight_come_back_exactly():
    codes, d = q5_0(29, 576)
    packed = five.pack(codes, d)
    assert [t.dtype for t in packed] == [torch.uint8, torch.float16, torch.uint8]
    assert [tuple(t.shape) for t in packed] == [(29, 288), (29, 18), (29, 72)]  # 5.5 bits a weight
    assert nibble_forms.form(packed) == nibble_forms.FIVE
    assert torch.equal(five.signed_codes(packed), (codes - 16).to(torch.int8))
    assert torch.equal(five.dequantize(packed), weight(codes, d))
    with pytest.raises(ValueError, match="no 4-bit fp32 form"):
        nibble_forms.expanded(packed)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 13])  # whole and partial 4-row tiles
@pytest.mark.parametrize("out_features", [36, 29])  # whole tiles and a ragged last one
@pytest.mark.parametrize("in_features", [64, 576])
def test_matches_rounded_x_times_the_exact_weight_in_each_build(isa, rows, out_features, in_features):
    codes, d = q5_0(out_features, in_features, seed=rows)
    codes[0] = 31  # the largest products: 2 * 31 * 127 per pair in the AVX2 build's int16 sums
    x, b = torch.randn(rows, 1, in_features), torch.randn(out_features)
    x[0, 0, :32] = 0  # a block of zeros: its step is 0, not a division by 0
    x[-1, 0, 40] = 50.0  # an outlier: its block's other inputs round coarsely, the same in both
    packed = five.pack(codes, d)
    w = weight(codes, d).double()
    expected = (reference.round_blocks_int8(x, 32, "fp16").double() @ w.T).float()  # ggml's Q8_0 x: fp16 steps
    assert_matches(five.linear(x, packed), expected)
    assert_matches(five.linear(x, packed, b), (expected.double() + b.double()).float())


def test_what_it_cannot_hold_or_run_is_refused():
    codes, d = q5_0(4, 96)
    assert not five.supports(96)  # whole loads of 64 only: a Q5_0 of 96 inputs stays a byte a code (cpu_linears)
    with pytest.raises(ValueError, match="whole blocks of 64"):
        five.pack(codes, d)
    codes, d = q5_0(4, 64)
    with pytest.raises(ValueError, match=r"\[0, 32\)"):
        five.pack(codes + 1, d)
    with pytest.raises(ValueError, match="fp16 values"):
        five.pack(codes, d + 1e-6)
    packed = five.pack(codes, d)
    with pytest.raises(ValueError, match="must end in 64"):
        five.linear(torch.randn(2, 32), packed)
    with pytest.raises(ValueError, match="packed tensors torch.uint8, torch.float16, torch.uint8"):
        five.linear(torch.randn(2, 64), (packed[0], packed[1].float(), packed[2]))
