"""Run AWQ over a model block by block: record inputs, search, fold scales, search grids, swap.

The searches (``awq.py``) return numbers; this file is where the model changes.
"""

import functools
import threading
from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch
from torch import nn
from tqdm import tqdm

from compress.calib import BlockDone, block_inputs, blocks, compute_device, record_inputs, run_block
from compress.model.arch import ScaleGroup
from compress.model.decoder import Decoder, RMSNorm
from compress.quant.awq import GridSearch, ScaleResult, group_hessians, search_scale, side_by_side
from compress.quant.block_tune import step_dtype, tune_block, tune_codes
from compress.quant.config import QuantConfig
from compress.quant.gptq import gptq_codes, prepare
from compress.quant.moe_calib import RoutedTokens, all_experts
from compress.quant.primitives import IntSpec, qparams
from compress.quant.swap import quantize_block

# Their error is shaped by softmax, not the output MSE (AutoAWQ's auto_clip skips them too). Phi-3's fused
# self_attn.qkv_proj is clip-searched whole, as AutoAWQ does (its skip list matches q_/k_, not qkv_proj): leaving it
# out would drop v's rows from the search, and each row's grid still minimizes that row's own output error.
NO_CLIP = ("self_attn.q_proj", "self_attn.k_proj")


def head_mapping(block: nn.Module, group: ScaleGroup, head_dim: int):
    """(reduce, expand) between the search space (prev's outputs) and the Linears' inputs.

    Equal widths: identity. v -> o under GQA: o's input channel h*D + d reads v's output
    channel kv(h)*D + d, so o's statistics are averaged over the heads of each KV group and
    a scale on v's channel is repeated for every head that reads it.
    """
    prev = block.get_submodule(group.prev) if group.prev else None
    first = block.get_submodule(group.linears[0])
    if not isinstance(prev, nn.Linear) or prev.out_features == first.in_features:
        return (lambda m: m), (lambda s: s)
    rep, kv = first.in_features // prev.out_features, prev.out_features // head_dim
    return (
        lambda m: m.view(kv, rep, head_dim).mean(1).flatten(),
        lambda s: s.view(kv, head_dim).repeat_interleave(rep, 0).flatten(),
    )


@torch.no_grad()
def fold_scales(block: nn.Module, group: ScaleGroup, s: torch.Tensor, expand) -> None:
    """prev's output /= s, the Linears' input columns *= s: the block computes the same function.
    A norm scaling by (offset + w) takes w' = (offset + w) / s - offset (Gemma's 1 + w)."""
    prev = block.get_submodule(group.prev)
    if isinstance(prev, RMSNorm):
        w = prev.weight  # offset 0: the division in the weight's dtype, as before there were offsets
        w.copy_((prev.offset + w.float()) / s.float() - prev.offset) if prev.offset else w.div_(s.to(w.dtype))
    else:
        prev.weight.div_(s.to(prev.weight.dtype)[:, None])
        if prev.bias is not None:
            prev.bias.div_(s.to(prev.bias.dtype))
    se = expand(s)
    for name in group.linears:
        w = block.get_submodule(name).weight
        w.mul_(se.to(w.dtype)[None, :])


def search_group(block, group: ScaleGroup, feats: dict, spec: IntSpec, cfg: QuantConfig, head_dim: int):
    reduce, expand = head_mapping(block, group, head_dim)
    module = block.get_submodule(group.module)
    prefix = group.module + "." if group.module != group.linears[0] else ""
    weights = {name.removeprefix(prefix) + ".weight" if prefix else "weight": block.get_submodule(name).weight
               for name in quantized(block, group)}  # a router in the group keeps its weights: W s / s = W
    f = feats[group.module]
    x = f["sequences"] if group.module == "self_attn" else f["tokens"]
    grid = cfg.grid if group.prev else 1  # nothing to fold a scale into: the one candidate alpha = 0, plain rounding
    return search_scale(module, weights, x, reduce(f["mean_abs"]), expand, spec, grid), expand


def quantized(block: nn.Module, group: ScaleGroup) -> list[str]:
    """The group's Linears that are quantized: all but a MoE layer's routers, which take the scale unrounded."""
    return [name for name in group.linears if name in block.linears]


def block_device(block: nn.Module) -> torch.device:
    return next(block.parameters()).device


class Job:
    """One item for ``side_by_side`` that first waits for the jobs it needs (``after``). side_by_side starts its
    items in list order, so a job listed after the ones it waits for cannot wait for a job that is not running."""

    def __init__(self, fn: Callable[[], object], after: Iterable["Job"] = ()):
        self.fn, self.after, self.done, self.result = fn, tuple(after), threading.Event(), None

    def __call__(self) -> None:
        try:
            for job in self.after:
                job.done.wait()
            self.result = self.fn()
        finally:
            self.done.set()  # also when fn raised: side_by_side re-raises it; the jobs waiting must not hang


@torch.no_grad()
def grids_and_codes(block: nn.Module, hessians: dict, grams: dict, spec: IntSpec, grid: int) -> tuple[dict, dict]:
    """(params, codes): the searched grid of each Linear of ``hessians`` (its group's input Hessians [G, g, g]), and
    for each Linear of ``grams`` (its inputs' E[x x^T] [I, I]) GPTQ's codes on that grid, or on the range's grid
    where none was searched (q, k), with the scales as stored, in the weight's dtype.

    Everything runs as one list of jobs side by side, each on one thread (GPTQ's column loop is many small ops),
    so that the long ones overlap the range search: the widest Linear first, its GPTQ factorization first of all
    (it needs only H); the factorization is shared by the Linears with one input (q, k, v; gate, up). The numbers
    are those of a one-thread run, whatever the thread count."""
    weights = {name: block.get_submodule(name).weight for name in hessians | grams}
    searches = {name: GridSearch(weights[name], h, spec, grid) for name, h in hessians.items()}
    jobs, prepared, rounded = [], {}, {}
    for name in sorted(weights, key=lambda name: (-weights[name].shape[1], -weights[name].numel())):
        if name in grams and id(grams[name]) not in prepared:
            prepared[id(grams[name])] = Job(functools.partial(prepare, grams[name]))
            jobs.append(prepared[id(grams[name])])
        tiles = [Job(functools.partial(searches[name].search, tile)) for tile in searches[name].tiles] if name in searches else []
        jobs += tiles
        if name in grams:
            prep = prepared[id(grams[name])]
            rounded[name] = Job(functools.partial(gptq_one, weights[name], grams[name], searches.get(name), prep, spec), [*tiles, prep])
            jobs.append(rounded[name])
    side_by_side(Job.__call__, jobs, block_device(block))
    params = {name: search.result() for name, search in searches.items()} | {name: job.result[0] for name, job in rounded.items()}
    return params, {name: job.result[1] for name, job in rounded.items()}


def gptq_one(w: torch.Tensor, gram: torch.Tensor, search: GridSearch | None, prep: Job, spec: IntSpec):
    """((scale, zero), codes) of GPTQ for w [O, I] on its searched grid, or its range's grid without a search."""
    scale, zero = search.result() if search is not None else qparams(w, spec)
    scale = scale.to(w.dtype)
    return (scale, zero), gptq_codes(w, gram, scale, zero, spec, prep.result)


# Rounds a block's Linears once its scales are folded: (block, hessians, grams, tune) with awq_block's dicts; tune
# (--tune-iters, else None) is block_tune.tune_codes bound to the block's inputs and target.
Finish = Callable[[nn.Module, dict, dict, Callable | None], None]


def awq_block(block: nn.Module, x: torch.Tensor, groups, spec: IntSpec, cfg: QuantConfig, head_dim: int, seed: int,
              calibrate=nullcontext, finish: Finish | None = None, target: torch.Tensor | None = None) -> list[ScaleResult]:
    """Search, fold and quantize one block in place; returns each group's search result. The inputs are recorded
    within ``calibrate()`` (moe_calib.all_experts). ``finish`` rounds the Linears instead of the swap to
    PackedLinears (a GGUF file's own types, compress/gguf/export.py). ``target`` [N, T, C]: the unquantized model's
    output of this block, which ``cfg.tune_iters`` steps of block_tune then fit before the swap."""
    groups = [g for g in groups if quantized(block, g)]  # a group the user kept unquantized (--ignore) keeps its input
    with calibrate():
        feats = record_inputs(block, x, [g.module for g in groups], cfg.search_sequences, cfg.search_tokens, seed, gram=cfg.gptq)
    found = [search_group(block, g, feats, spec, cfg, head_dim) for g in groups]
    hessians = {}  # per searched Linear: its group's input second moments [G, g, g], shared by the group
    grams = {}  # GPTQ: per Linear, E[x x^T] of its scaled input over every calibration token [I, I]
    for g, (res, expand) in zip(groups, found):
        if g.prev:  # else the scales are ones
            fold_scales(block, g, res.scales, expand)
        searched = [name for name in quantized(block, g) if name not in NO_CLIP] if cfg.clip_search else []
        if searched:
            h = group_hessians(feats[g.module]["tokens"] / expand(res.scales).to(x.dtype), spec.group_size)
            hessians |= dict.fromkeys(searched, h)
        if cfg.gptq:
            inv = 1 / expand(res.scales).float()  # [I]: the fold divided the inputs by the scales
            grams |= dict.fromkeys(quantized(block, g), feats[g.module]["gram"] * inv[:, None] * inv[None, :])
    # After every fold: v -> o and up -> down rescale the rows of v and up, whose grids are searched here.
    dtype = None if target is None else step_dtype(x.device, cfg.tune_dtype)
    if finish is not None:
        tune = None if target is None else functools.partial(tune_codes, block, x, target, iters=cfg.tune_iters,
                                                             seed=seed, dtype=dtype)
        finish(block, hessians, grams, tune)
        return [res for res, _ in found]
    params, codes = grids_and_codes(block, hessians, grams, spec, cfg.grid)
    if target is not None:
        params, codes = tune_block(block, x, target, params, codes, spec, cfg.tune_iters, seed, dtype)
    quantize_block(block, spec, params, codes)
    return [res for res, _ in found]


def awq_quantize(model: Decoder, spec: IntSpec, cfg: QuantConfig, calib: torch.Tensor, verbose: bool = False,
                 done: BlockDone | None = None, routed: RoutedTokens | None = None,
                 finish: Callable[[int], Finish] | None = None) -> None:
    """Quantize ``model`` in place, feeding each quantized block's outputs to the next; ``done(i, block)``
    after each block (a lazy model's block is released after it); ``routed`` counts the experts' tokens;
    ``finish(i)``: layer i's rounding in place of the swap (``awq_block``)."""
    device = compute_device()
    x = block_inputs(model, calib, device)  # [N, T, C]
    x_fp = x if cfg.tune_iters else None  # the unquantized model's inputs, whose outputs block_tune fits
    positions = torch.arange(x.shape[1], device=device)[None]  # [1, T]: same positions for every row
    bar = tqdm(blocks(model, device, done), total=model.cfg.num_layers, desc=f"AWQ int{spec.bits}", unit="block")
    for i, block in bar:
        model.prepare(positions, x.dtype)
        groups = model.cfg.layer_groups(i)
        calibrate = functools.partial(all_experts, block, f"model.layers.{i}.", routed)
        target = run_block(block, x_fp) if x_fp is not None else None  # before the block changes
        results = awq_block(block, x, groups, spec, cfg, model.cfg.head_dim, cfg.seed + i, calibrate,
                            finish(i) if finish is not None else None, target)
        x_fp = target
        x = run_block(block, x)
        gain = sum(r.loss for r in results) / max(sum(r.loss_unscaled for r in results), 1e-30)
        bar.set_postfix(loss_vs_rtn=f"{gain:.2f}")
        if verbose:
            detail = ", ".join(f"{g.prev}->{g.linears[0].split('.')[-1]} a={r.alpha:.2f} loss={r.loss:.3g}" for g, r in zip(groups, results))
            tqdm.write(f"block {i}: {detail}")
