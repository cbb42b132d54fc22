"""The runtime's RMSNorm swap and the timing candidates of the small per-layer ops."""

import pytest
import torch

from compress.kernels import rms_norm_cpu, rope_cpu
from compress.model.config import ModelConfig
from compress.model.decoder import RMSNorm
from compress.model.rope import apply_rope
from compress.model.attention import AttentionSpec
from compress.runtime.attention import AttentionMetadata, PagedAttention
from compress.runtime.cpu_norms import CpuRMSNorm, norm_candidates, rope_candidates, swap_norms
from compress.runtime.kernel_choice import C, TORCH
from tests.runtime.test_cpu_kernels import count_calls

needs_kernels = pytest.mark.skipif(None in (rms_norm_cpu.load(), rope_cpu.load()), reason="no C compiler builds the kernels here")


@needs_kernels
def test_every_norm_is_swapped_and_runs_the_kernel_per_its_table(monkeypatch):
    model = torch.nn.Sequential(RMSNorm(32, 1e-5), torch.nn.Sequential(RMSNorm(32, 1e-6)))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, RMSNorm):
                m.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 32)
    with torch.no_grad():  # as the engine runs (with autograd the kernel declines: it has no backward)
        before = model(x)
        swapped = swap_norms(model)
        assert len(swapped) == 2 and all(isinstance(m, CpuRMSNorm) for m in (model[0], model[1][0]))
        assert model[1][0].weight is swapped[1].weight and model[1][0].eps == 1e-6  # the same weight, not a copy
        calls = count_calls(monkeypatch, rms_norm_cpu, "rms_norm")
        for norm in swapped:
            norm.use_c = [True, True, False]  # C at 1 row, torch from 2
        torch.testing.assert_close(model(x[:1]), before[:1], rtol=2e-6, atol=1e-6)
        assert len(calls) == 2
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # 3 rows: torch's op, the same numbers
        assert len(calls) == 2
        assert swap_norms(model) == []  # already swapped
    model(x[:1]).sum().backward()  # torch's op, with autograd
    assert len(calls) == 2 and model[0].weight.grad is not None


@needs_kernels
def test_the_paged_backend_rotates_in_the_kernel_when_told():
    meta = AttentionMetadata.build([0], [3], [[0]], 16, "cpu")
    kv = torch.zeros(2, 1, 1, 16, 2, 8)
    q, cos, sin = torch.randn(1, 3, 4, 8), torch.rand(1, 3, 8), torch.rand(1, 3, 8)
    ref = apply_rope(q, cos, sin)
    for rope_kernel in (False, True):
        assert torch.equal(PagedAttention(kv, meta, AttentionSpec(), rope_kernel=rope_kernel).rotate(q, cos, sin), ref)


@needs_kernels
def test_timing_candidates_compute_the_same_thing():
    """Each candidate pass runs its op enough times for ~64K elements; C and torch agree."""
    for rows in (1, 100):
        cands = norm_candidates(64, rows)
        assert set(cands) == {C, TORCH}
        cands[C](), cands[TORCH]()
    cfg = ModelConfig("llama", 16, 64, 128, 1, 4, 2, 32)
    cands = rope_candidates(cfg, 5)
    assert set(cands) == {C, TORCH}
    cands[C](), cands[TORCH]()
