"""The C RMSNorm against torch's F.rms_norm (in each x86 build): the same up to the order of the sum of squares."""

import pytest
import torch
import torch.nn.functional as F

from compress.kernels import rms_norm_cpu

needs_compiler = pytest.mark.skipif(rms_norm_cpu.load() is None, reason="no C compiler builds the kernel here")


@needs_compiler
@pytest.mark.parametrize("shape", [(1, 1, 576), (7, 576), (2, 300, 4096), (3, 100), (1, 5)])
def test_matches_torch(isa, shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * 3
    x[..., 0] += 40  # an outlier channel, as in LLM activations
    w = torch.rand(shape[-1], generator=g) + 0.5
    out = rms_norm_cpu.rms_norm(x, w, 1e-5)
    assert out.shape == x.shape
    torch.testing.assert_close(out, F.rms_norm(x, (shape[-1],), w, 1e-5), rtol=2e-6, atol=1e-6)


@needs_compiler
def test_eps_and_zero_rows():
    x, w = torch.zeros(2, 64), torch.ones(64)
    x[1] = 1e-4
    torch.testing.assert_close(rms_norm_cpu.rms_norm(x, w, 1e-2), F.rms_norm(x, (64,), w, 1e-2))
    assert torch.equal(rms_norm_cpu.rms_norm(x, w, 1e-6)[0], torch.zeros(64))


def test_declines_what_it_does_not_take():
    x, w = torch.randn(2, 8), torch.ones(8)
    assert not rms_norm_cpu.supports(x.double(), w.double())
    assert not rms_norm_cpu.supports(x, torch.ones(7))
    assert not rms_norm_cpu.supports(x, w.requires_grad_())
