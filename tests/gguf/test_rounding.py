"""round_linears: the codes each AWQ rounding gives inside a GGUF type's blocks (tuned on the block's output too), and
the block left computing with them."""

import copy
import functools

import pytest
import torch

from compress.gguf import rounding
from compress.quant.awq import group_hessians, search_qparams
from compress.quant.block_tune import tune_codes
from compress.quant.gguf_blocks import TYPES, dequantize, fit_grid, nearest_codes, unpack
from compress.quant.primitives import IntSpec
from tests.quant.test_block_tune import block_and_inputs as decoder_block
from tests.quant.test_block_tune import block_error


def block_and_inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    block = torch.nn.Sequential()
    block.add_module("a", torch.nn.Linear(256, 64, bias=False))
    block.add_module("b", torch.nn.Linear(256, 96, bias=False))
    with torch.no_grad():
        for lin in block:
            lin.weight.copy_(torch.randn(lin.weight.shape, generator=g) * 0.05)
    mix = torch.randn(256, 256, generator=g) / 256**0.5 + torch.eye(256)  # correlated input channels
    x = (torch.randn(2048, 256, generator=g) @ mix) * (1 + 4 * torch.rand(256, generator=g))  # [N, I]
    return block, x


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_nearest_on_the_searched_grid_without_a_gram(kind):
    block, x = block_and_inputs()
    w = block.a.weight.detach().clone()
    h = group_hessians(x, 32)
    raw = rounding.round_linears(block, {"a": kind}, hessians={"a": h})
    t = TYPES[kind]
    scale, zero = search_qparams(w, h, IntSpec(4, 32, t.symmetric))
    grid = fit_grid(t, scale, -zero.float() * scale)
    want = rounding.weight_of(kind, nearest_codes(t, w, grid), grid)
    assert torch.equal(block.a.weight.detach(), want)
    assert raw["a"].dtype == torch.uint8 and raw["a"].shape == (64, 256 // 32 * t.type_size)


@pytest.mark.parametrize("kind", ["Q4_0", "Q6_K"])
def test_gptq_codes_lower_the_output_error_and_every_linear_is_rounded(kind):
    block, x = block_and_inputs(1)
    weights = {n: block.get_submodule(n).weight.detach().clone() for n in ("a", "b")}
    gram = x.T @ x / x.shape[0]  # [I, I]
    h = group_hessians(x, 32)
    rounding.round_linears(block, {"a": kind, "b": kind}, hessians={"a": h, "b": h}, grams={"a": gram, "b": gram})
    for n, w in weights.items():
        t = TYPES[kind]
        got = block.get_submodule(n).weight.detach()
        if t.group == 32:  # the grid searched on the group Hessians
            scale, zero = search_qparams(w, h, IntSpec(4, 32, True))
            grid = fit_grid(t, scale, -zero.float() * scale)
        else:  # Q6_K's 16-weight groups: the weighted range search
            grid = rounding.join([rounding.search_grid(t, w, torch.diagonal(gram))])
        near = rounding.weight_of(kind, nearest_codes(t, w, grid), grid)
        err = lambda q: ((x @ (q - w).T) ** 2).mean().item()  # noqa: E731
        assert err(got) < 0.9 * err(near)


def test_weight_only_without_calibration():
    block, _ = block_and_inputs(2)
    w = block.b.weight.detach().clone()
    rounding.round_linears(block, {"b": "Q8_0"})
    assert torch.equal(block.b.weight.detach(), rounding.weight_only("Q8_0", w)[1])


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "F16"])
def test_weight_only_bytes_alone_are_the_same_bytes(kind):
    w = torch.randn(40, 256, generator=torch.Generator().manual_seed(3)) * 0.02
    raw, weight = rounding.weight_only(kind, w)
    alone, none = rounding.weight_only(kind, w, keep_weight=False, desc="test")
    assert none is None and torch.equal(alone, raw) and weight.shape == w.shape


@pytest.mark.parametrize("kind", ["Q4_0"])  # Q4_1's offset grids: tests/quant/test_block_tune.py
def test_tuning_moves_codes_one_step_on_the_same_grids_and_fits_the_block_output(kind):
    untuned, x, target = decoder_block()  # a Llama block of the planted model, its input [N, T, C] and output
    tuned = copy.deepcopy(untuned)
    kinds = dict.fromkeys(untuned.linears, kind)
    raw = rounding.round_linears(untuned, kinds)
    tune = functools.partial(tune_codes, tuned, x, target, iters=60, seed=0)
    raw_tuned = rounding.round_linears(tuned, kinds, tune=tune)
    t, steps = TYPES[kind], []
    for n in kinds:
        width = tuned.get_submodule(n).weight.shape[1]
        codes, grid = unpack(t, raw[n], width)
        codes_t, grid_t = unpack(t, raw_tuned[n], width)
        assert torch.equal(grid.a, grid_t.a) and torch.equal(grid.b, grid_t.b)  # the type's stored numbers stay
        steps.append((codes_t.int() - codes.int()).flatten())
        assert torch.equal(tuned.get_submodule(n).weight.detach(), dequantize(t, raw_tuned[n], width))  # computes with the file's weights
    steps = torch.cat(steps)
    assert steps.abs().max() == 1 and (steps != 0).float().mean() > 0.01
    assert block_error(tuned, x, target) < 0.8 * block_error(untuned, x, target)
