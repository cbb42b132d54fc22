"""The jobs that finish a block (range search tiles, GPTQ factorizations and codes, side by side) give the numbers
of running each step alone, in order."""

import pytest
import torch
from torch import nn

from compress.quant.awq import group_hessians, search_qparams
from compress.quant.awq_apply import Job, grids_and_codes
from compress.quant.gptq import gptq_codes
from compress.quant.primitives import IntSpec, qparams

SPEC = IntSpec(4, 32)


def toy_block() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A module with attn.{q,v} (one input, 64 wide) and mlp.down (128 wide), and inputs for each width."""
    gen = torch.Generator().manual_seed(0)
    block, block.attn, block.mlp = nn.Module(), nn.Module(), nn.Module()
    block.attn.q, block.attn.v, block.mlp.down = nn.Linear(64, 96, bias=False), nn.Linear(64, 32, bias=False), nn.Linear(128, 64, bias=False)
    for lin in (block.attn.q, block.attn.v, block.mlp.down):
        lin.weight.data = torch.randn(lin.weight.shape, generator=gen) * 0.05
    mix = lambda n: torch.randn(n, n, generator=gen) / n**0.5 + torch.eye(n)  # noqa: E731
    return block, torch.randn(512, 64, generator=gen) @ mix(64), torch.randn(512, 128, generator=gen) @ mix(128)


def test_the_jobs_give_the_numbers_of_each_step_alone():
    block, x64, x128 = toy_block()
    gram64, gram128 = x64.T @ x64 / 512, x128.T @ x128 / 512  # q and v share one H, as q, k, v do
    hessians = {"attn.v": group_hessians(x64, 32), "mlp.down": group_hessians(x128, 32)}
    grams = {"attn.q": gram64, "attn.v": gram64, "mlp.down": gram128}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        params, codes = grids_and_codes(block, hessians, grams, SPEC, grid=20)
    finally:
        torch.set_num_threads(before)
    for name, gram in grams.items():
        w = block.get_submodule(name).weight
        scale, zero = search_qparams(w, hessians[name], SPEC) if name in hessians else qparams(w, SPEC)
        assert torch.equal(params[name][0], scale.to(w.dtype)) and torch.equal(params[name][1], zero), name
        assert torch.equal(codes[name], gptq_codes(w, gram, scale.to(w.dtype), zero, SPEC)), name


def test_a_failing_job_still_releases_the_jobs_waiting_for_it():
    failing = Job(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing()
    waiting = Job(lambda: "ran", [failing])
    waiting()  # returns: it does not wait forever
    assert failing.done.is_set() and waiting.result == "ran"
