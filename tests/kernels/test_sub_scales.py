"""A K-quant's fp32 products d * sc taken apart into one unit and bytes (or int8s, Q6_K's), exactly, and nothing else taken
apart."""

import torch

from compress.kernels.sub_scales import factor, factor_signed


def q4_k_scales(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(d [n] fp16 values, sc [n, 8] 6-bit, d * sc [n, 8] fp32) as a Q4_K file's super-blocks give them."""
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, generator=g) * 0.01 + 1e-6).half().float()
    sc = torch.randint(0, 64, (n, 8), generator=g)
    return d, sc, d[:, None] * sc.float()


def test_products_of_fp16_and_6_bit_integers_come_apart_exactly():
    d, sc, values = q4_k_scales(4096)
    values[:3] = 0  # super-blocks of zeros (a row of zeros): unit 0
    unit, k = factor(values)
    assert unit.dtype == torch.float32 and k.dtype == torch.uint8 and k.shape == (4096, 8)
    assert torch.equal(unit[:, None] * k.float(), values)
    assert int(k.max()) <= 63  # sc over the gcd of its super-block's sc
    common = sc[:, 0]
    for j in range(1, 8):
        common = torch.gcd(common, sc[:, j])
    assert torch.equal(unit[3:], d[3:] * common[3:].float())  # d times the gcd of the block's sc
    neg_unit, neg_k = factor(-values)  # minus the mins, as the offsets hold them
    assert torch.equal(neg_unit, -unit) and torch.equal(neg_k, k)


def test_values_that_are_not_such_products_are_refused():
    assert factor(torch.randn(64, 8)) is None  # mixed signs
    assert factor(torch.rand(64, 8) + 0.1) is None  # 24-bit mantissas: no byte-sized k
    _, _, values = q4_k_scales(64)
    values[5, 2] = -values[5, 2] - 1  # one super-block of mixed signs
    assert factor(values) is None
    _, _, values = q4_k_scales(64)
    values[7, 0] *= 2.0**10  # a span no 6-bit integers make: k past a byte
    assert factor(values) is None


def test_signed_products_of_fp16_and_int8_come_apart_exactly():
    g = torch.Generator().manual_seed(1)
    d = (torch.randn(2048, generator=g) * 0.01).half().float()  # Q6_K's d: either sign
    sc = torch.randint(-128, 128, (2048, 16), generator=g)
    sc[:, 0] = -128  # the largest sub-scale, as ggml rounds it: -128 d
    values = d[:, None] * sc.float()
    values[:2] = 0
    unit, k = factor_signed(values)
    assert unit.dtype == torch.float32 and k.dtype == torch.int8 and k.shape == (2048, 16)
    assert torch.equal(unit[:, None] * k.float(), values)
    assert torch.equal(k[2:, 0], torch.full((2046,), -128, dtype=torch.int8))  # +128 would not fit: the unit's sign flips
    positive = d.abs()[:, None] * sc.clamp(-127, 127).abs().float()
    unit, k = factor_signed(positive)
    assert torch.equal(unit[:, None] * k.float(), positive) and bool((k >= 0).all())


def test_signed_values_that_no_int8s_make_are_refused():
    assert factor_signed(torch.randn(64, 16)) is None  # 24-bit mantissas
    values = torch.tensor([[1.0, 255.0] + [0.0] * 14])  # a span of 255: past int8
    assert factor_signed(values) is None
    assert factor_signed(torch.tensor([[128.0, -128.0, 1.0] + [0.0] * 13])) is None  # +128 and -128 units: one cannot be int8
