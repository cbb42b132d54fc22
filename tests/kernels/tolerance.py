"""The bound every kernel test holds its output to: the reference's numbers up to rounding."""

import torch

# fp32 kernels differ from the reference only in summation order; 16-bit outputs may also differ
# by the reference's extra intermediate roundings: two units in the last place at the largest value.
RELATIVE = {torch.float32: 1e-5, torch.float16: 2 * 2.0**-10, torch.bfloat16: 2 * 2.0**-7}


def assert_matches(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert y.shape == ref.shape and y.dtype == ref.dtype
    bound = RELATIVE[ref.dtype] * ref.float().abs().max().item()
    err = (y.float() - ref.float()).abs().max().item()
    assert err <= bound, f"max |kernel - reference| = {err:.3g} > {bound:.3g}"
