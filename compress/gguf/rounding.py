"""One weight into one GGUF type: the type's grid (searched on the output error where AWQ gave group Hessians,
else our weighted range search) and the codes on it (GPTQ's error feedback where the inputs' E[x x^T] is known,
else nearest), then moved on that grid to fit the block's output where AWQ's --tune-iters asks (block_tune).
Returns the type's bytes and the weight they stand for, which the block then computes with.

GPTQ (gptq.py) rounds onto grids w = (q - z) s with one (s, z) per group; a GGUF grid is w = q a + b per group
with any offset b, so it runs on w - b with s = a, z = 0: the errors, hence the feedback, are the same.
"""

import functools
from collections.abc import Callable

import torch
from tqdm import tqdm

from compress.quant.awq import GridSearch, side_by_side
from compress.quant.awq_apply import Job
from compress.quant.block_tune import Rounding
from compress.quant.gguf_blocks import TYPES, Grid, fit_grid, nearest_codes, pack
from compress.quant.gguf_search import search_grid
from compress.quant.gptq import gptq_codes, prepare
from compress.quant.primitives import IntSpec

TILE = 2**17  # weights searched per job: the search's many small ops run one job per core (awq.side_by_side)


def expand(grid_values: torch.Tensor, group: int) -> torch.Tensor:
    """[O, G] -> [O, G * group]: each group's value on each of its weights."""
    return grid_values.repeat_interleave(group, dim=1)


def weight_of(kind: str, codes: torch.Tensor, grid: Grid) -> torch.Tensor:
    """fp32 [O, I]: what the codes on ``grid`` dequantize to (q a + b)."""
    g = TYPES[kind].group
    return codes.float() * expand(grid.a, g) + expand(grid.b, g)


def unquantized(kind: str, w: torch.Tensor, keep_weight: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    stored = w.to(torch.float16 if kind == "F16" else torch.float32)
    return stored, stored.float() if keep_weight else None


def tiles(w: torch.Tensor) -> list[slice]:
    rows = max(1, TILE // w.shape[1])
    return [slice(r0, r0 + rows) for r0 in range(0, w.shape[0], rows)]


def weight_only(kind: str, w: torch.Tensor, keep_weight: bool = True, desc: str | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(bytes uint8 [O, nbytes], weight fp32 [O, I] or None unless ``keep_weight``) of w [O, I] (any float dtype)
    rounded to nearest on our searched grid (no calibration: every column weighs the same). Rows are searched a tile
    at a time (an 8B model's 152k-row embedding is never widened whole, and is only written: no fp32 copy), the
    tiles side by side; ``desc``: a progress bar of rows with that label."""
    if kind in ("F16", "F32"):
        return unquantized(kind, w, keep_weight)
    t = TYPES[kind]
    raw = torch.empty(w.shape[0], w.shape[1] // t.block * t.type_size, dtype=torch.uint8)
    out = torch.empty(w.shape, dtype=torch.float32) if keep_weight else None
    bar = tqdm(total=w.shape[0], desc=desc, unit="row", disable=desc is None, leave=False)

    def job(rows: slice) -> None:
        x = w[rows].float()  # [R, I]
        grid = search_grid(t, x)
        codes = nearest_codes(t, x, grid)
        raw[rows] = pack(t, codes, grid)
        if out is not None:
            out[rows] = weight_of(kind, codes, grid)
        bar.update(x.shape[0])

    side_by_side(job, tiles(w), w.device)
    bar.close()
    return raw, out


def join(grids: list[Grid]) -> Grid:
    stored = {k: torch.cat([g.stored[k] for g in grids]) for k in grids[0].stored}
    return Grid(torch.cat([g.a for g in grids]), torch.cat([g.b for g in grids]), stored)


def grid_jobs(kind: str, w: torch.Tensor, importance: torch.Tensor | None, hessians: torch.Tensor | None,
              grid: int) -> tuple[list[Job], Callable[[], Grid]]:
    """(jobs, result) choosing w's grid [O, I] in tiles: the range search on the output error (awq.GridSearch with the
    group Hessians [G, g, g]) for a 4-bit type whose group is the Hessians', fitted to what the type stores; else
    the weighted range search (search_grid) with ``importance`` [I]."""
    t = TYPES[kind]
    if hessians is not None and t.group == hessians.shape[-1] and t.bits == 4:
        search = GridSearch(w, hessians, IntSpec(t.bits, t.group, t.symmetric), grid)

        def searched() -> Grid:
            scale, zero = search.result()  # [O, G]
            return fit_grid(t, scale, -zero.float() * scale)

        return [Job(functools.partial(search.search, tile)) for tile in search.tiles], searched
    parts: dict[int, Grid] = {}
    spans = tiles(w)

    def part(rows: slice) -> None:
        parts[rows.start] = search_grid(t, w[rows].float(), importance)

    return [Job(functools.partial(part, rows)) for rows in spans], lambda: join([parts[r.start] for r in spans])


def gptq_on(kind: str, w: torch.Tensor, gram: torch.Tensor, prepared, grid_: Grid) -> torch.Tensor:
    """uint8 [O, I]: GPTQ's codes for w [O, I] on ``grid_`` given its inputs' E[x x^T] [I, I] (``prepared``:
    gptq.prepare(gram))."""
    t, w = TYPES[kind], w.float()
    return gptq_codes(w - expand(grid_.b, t.group), gram, grid_.a, torch.zeros_like(grid_.a, dtype=torch.int32),
                      IntSpec(t.bits, t.group), prepared)


def codes_job(kind: str, w: torch.Tensor, gram: torch.Tensor | None, prep: Job | None, grid_of: Callable[[], Grid],
              searches: list[Job]) -> Job:
    """A job giving (codes uint8 [O, I], Grid) of w once its grid's ``searches`` (and GPTQ's ``prep``) are done:
    GPTQ's codes where the gram is known, else nearest."""
    def run() -> tuple[torch.Tensor, Grid]:
        grid_ = grid_of()
        if gram is None:
            return nearest_codes(TYPES[kind], w.float(), grid_), grid_
        return gptq_on(kind, w, gram, prep.result, grid_), grid_

    return Job(run, searches if gram is None else [*searches, prep])


# Tunes the codes of a block's Linears (name -> block_tune.Rounding) on its output: block_tune.tune_codes, bound.
Tune = Callable[[dict[str, Rounding]], dict[str, torch.Tensor]]


@torch.no_grad()
def round_linears(block: torch.nn.Module, kinds: dict[str, str], hessians: dict | None = None, grams: dict | None = None,
                  grid: int = 20, tune: Tune | None = None) -> dict[str, torch.Tensor]:
    """Round the Linears of ``block`` named in ``kinds`` (name -> type) and make the block compute with the result;
    returns their bytes by name. ``hessians`` (name -> group Hessians) and ``grams`` (name -> E[x x^T]) come from
    AWQ (awq_apply.awq_block's ``finish``): a Linear's grid is searched on its output error or weighted by its
    inputs where they are known (grid_jobs), and its codes chosen by GPTQ given its gram, else nearest (AWQ's
    --rounding nearest; RTN); all as one list of jobs side by side as awq_apply.grids_and_codes runs them (widest
    Linear first; the Linears with one input share its factorization). ``tune`` then moves the codes on their
    grids to fit the block's output (AWQ's --tune-iters)."""
    hessians, grams = hessians or {}, grams or {}
    weights = {name: block.get_submodule(name).weight for name in kinds}
    jobs, prepared, rounded, out = [], {}, {}, {}
    for name in sorted(weights, key=lambda name: (-weights[name].shape[1], -weights[name].numel())):
        w, kind, gram = weights[name], kinds[name], grams.get(name)
        if kind in ("F16", "F32"):
            out[name] = unquantized(kind, w)
            continue
        importance = None if gram is None else torch.diagonal(gram).float()
        searches, grid_of = grid_jobs(kind, w, importance, hessians.get(name), grid)
        if gram is not None and id(gram) not in prepared:
            prepared[id(gram)] = Job(functools.partial(prepare, gram))
            jobs.append(prepared[id(gram)])
        rounded[name] = codes_job(kind, w, gram, prepared.get(id(gram)), grid_of, searches)
        jobs += [*searches, rounded[name]]
    side_by_side(Job.__call__, jobs, next(block.parameters()).device)
    found = {name: job.result for name, job in rounded.items()}  # name -> (codes, grid)
    if tune is not None and found:
        tuned = tune({name: Rounding.start(weights[name], g.a, g.b, codes, TYPES[kinds[name]].qmax)
                      for name, (codes, g) in found.items()})
        found = {name: (tuned[name], g) for name, (_, g) in found.items()}
    for name, (codes, g) in found.items():
        out[name] = pack(TYPES[kinds[name]], codes, g), weight_of(kinds[name], codes, g)
    for name, (_, w) in out.items():
        weights[name].copy_(w.to(weights[name].dtype))
    return {name: raw for name, (raw, _) in out.items()}
