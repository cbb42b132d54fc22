"""Which kernel runs an op at each row count on CPU: our C kernel, torch's, or (for Linears) our panel GEMM
over W packed per call, chosen by timing them at engine start on the model's own shapes, not assumed
(docs/runtime.md, "Kernels chosen by measurement").

An op (a Linear shape, decode attention) is timed at a few row counts, ``buckets``, spaced at most
1.5x apart up to the most the engine runs; a row count between two buckets takes the choice of the
bucket below it, or where the two chose different kernels, the choice that each candidate's time,
interpolated geometrically in the row count between them, gives. At each bucket the candidates are
timed interleaved (C, torch, torch, C, ...: a slow spell of a shared machine hits both), each pass
~1 ms of work, and each keeps its fastest of
``REPEATS`` passes (up to 3x as many until it is repeated). A fastest pass must be repeated: unless
a second pass of every candidate comes within ``NOISE`` of its fastest, the machine was too busy to
tell them apart, and the bucket is left untimed (not cached). The fastest wins unless the preferred candidate is within ``MARGIN`` of it:
torch for fp32 Linears and attention (a wrong call within the noise then costs nothing against
torch), the C kernel for int4/int3 Linears (the other paths need a dequantized scratch copy); and
another candidate must win twice (``confirmed``): a slow spell during the preferred kernel's passes
alone then cannot switch it. An
untimed bucket (noise, or past ``BUDGET_S`` of timing at one start, coarse buckets being timed
first) takes the choice of the nearest timed one below it, or the preferred kernel where none is below (the
nearest either way once gave a 1.1B model's lm_head the panel GEMM at one row, from its largest bucket: decode
at a third of its speed), and is timed again at the next start. Timings are cached in ``$COMPRESS_CACHE/kernels/choices.json`` under a key of the CPU's
flags, torch's version, the thread count, the kernel build and the op; a second start on the same
host reads them and times nothing.
"""
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from compress.kernels import (cpu_build, int8_rows_cpu, linear_cpu, nibble_linear_cpu, nibble_panel_cpu, nibble_q8_cpu,
                              paged_attention_cpu, panel_cpu)

C, TORCH = "C", "torch"
# A Linear's third path (kernels/panel_cpu.py): W copied, or a held weight dequantized, into panels per call for an
# outer-product GEMM; pays its copy back at many rows, where the C kernel's dot products lose to torch's GEMM
PANEL = "C panel"
REPEATS = 5
MARGIN = 0.03  # a lead this small is within the noise (one kernel against itself: 0.94-1.0, docs/results/speed.md)
# The one-call decode step (runtime/cpu_step.py) runs every op's C kernel; it runs where each op's C kernel is within
# this of the op's fastest: one call instead of ~11 ops a block was 1.15-1.19x a whole generate at batch 4-16 on
# SmolLM2, and ops whose C kernel and the panel GEMM are even (6-12 rows) would otherwise switch it off by noise.
FUSE_MARGIN = 0.10
NOISE = 0.10  # a fastest pass not repeated within this: too busy a machine to time
BUDGET_S = 3.0  # timing at one engine start stops here; the buckets left are timed at later starts
BUCKET_S = 0.25  # a bucket's candidates get fewer rounds past this (a machine too busy to time quickly)


def buckets(max_rows: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, ... (each at most 1.5x the last) up to and including max_rows."""
    rows, r = [], 1
    while r < max_rows:
        rows.append(r)
        r = r + 1 if r < 4 else r + (r // 2 if (r & (r - 1)) == 0 else r // 3)
    return rows + [max_rows]


@dataclass(frozen=True)
class Plan:
    """The kernel per bucket: kernels[i] runs from rows[i] rows up to the next bucket, except between two
    buckets that chose different kernels, where torch / C interpolated between them decides."""

    rows: tuple[int, ...]  # ascending, rows[0] == 1
    kernels: tuple[str, ...]
    times: tuple[dict[str, float] | None, ...]  # ms per candidate, per bucket (None: not timed)
    preferred: str = TORCH

    def __post_init__(self):
        if not self.rows or self.rows[0] != 1 or list(self.rows) != sorted(set(self.rows)):
            raise ValueError(f"rows must ascend from 1 without repeats, got {self.rows}")
        if not len(self.rows) == len(self.kernels) == len(self.times):
            raise ValueError("rows, kernels and times must have one entry per bucket")

    def choices(self) -> list[str]:
        """The kernel at r rows for r in 0..rows[-1] (callers use the last entry beyond)."""
        choices = [self.preferred] * (self.rows[-1] + 1)
        for i, start in enumerate(self.rows):
            end = self.rows[i + 1] if i + 1 < len(self.rows) else len(choices)
            switch = i + 1 < len(self.rows) and self.kernels[i + 1] != self.kernels[i]
            choices[start:end] = [self._between(i, r) if switch else self.kernels[i] for r in range(start, end)]
        choices[0] = choices[1]
        return choices

    def table(self) -> list[bool]:
        """use_c[r] for r in 0..rows[-1]: whether r rows run the C kernel (callers use the last entry beyond)."""
        return [k == C for k in self.choices()]

    def near(self, kernel: str, margin: float) -> list[bool]:
        """near[r] for r in 0..rows[-1]: whether `kernel`'s time at r rows (interpolated as between buckets
        below) is within `margin` of the fastest candidate's; from a bucket up to the next, where either is
        untimed, whether it is the choice."""
        out = [k == kernel for k in self.choices()]
        for i, start in enumerate(self.rows):
            end = self.rows[i + 1] if i + 1 < len(self.rows) else len(out)
            for r in range(start, end):
                ms = self._interpolated(i, r)
                if ms is not None and kernel in ms:
                    out[r] = ms[kernel] <= (1 + margin) * min(ms.values())
        out[0] = out[1]
        return out

    def _interpolated(self, i: int, rows: int) -> dict[str, float] | None:
        """Each candidate's time at `rows`, from bucket i to the next, geometrically in the row count (bucket i's
        beyond the last); None where a bucket is untimed."""
        a = self.times[i]
        if i + 1 == len(self.rows):
            return a
        b = self.times[i + 1]
        if a is None or b is None:
            return None
        f = math.log(rows / self.rows[i]) / math.log(self.rows[i + 1] / self.rows[i])
        return {k: a[k] * (b[k] / a[k]) ** f for k in a if k in b}

    def _between(self, i: int, rows: int) -> str:
        """The kernel at `rows`, between bucket i and the next, which chose another kernel: decided on the times
        interpolated between them as a timed bucket is (a bucket's lead does not hold all the way to a bucket
        that chose another kernel)."""
        ms = self._interpolated(i, rows)
        return self.kernels[i] if ms is None else decide(ms, self.preferred)

    def describe(self) -> str:
        """The table in words, e.g. "C at 1-12 rows, torch from 16"."""
        names = self.choices()[1:]  # rows 1..rows[-1]
        starts = [r for r in range(1, len(names) + 1) if r == 1 or names[r - 1] != names[r - 2]]
        if len(starts) == 1:
            return f"{names[0]} at every row count"
        parts = []
        for n, first in enumerate(starts[:-1]):
            last = starts[n + 1] - 1
            unit = "" if n else (" rows" if last > first else " row")
            parts.append(f"{names[first - 1]} at {first}" + (f"-{last}" if last > first else "") + unit)
        return ", ".join([*parts, f"{names[starts[-1] - 1]} from {starts[-1]}"])


def decide(ms: dict[str, float], preferred: str) -> str:
    """The candidate that runs: the fastest, unless the preferred one is within MARGIN of it."""
    fastest = min(ms, key=ms.get)
    return preferred if ms[preferred] <= ms[fastest] * (1 + MARGIN) else fastest


def repeated(ms: list[float]) -> bool:
    """Whether the fastest of these passes was matched within NOISE by another (one pass: nothing to tell)."""
    return len(ms) < 2 or sorted(ms)[1] <= (1 + NOISE) * min(ms)


def time_candidates(candidates: dict[str, Callable[[], object]], repeats: int = REPEATS, max_seconds: float = BUCKET_S,
                    clock: Callable[[], float] = time.perf_counter) -> dict[str, float] | None:
    """ms of each candidate's fastest pass: one warm-up each, then rounds of passes interleaved in
    alternating order, ``repeats`` of them, more (up to 3x) until every fastest pass is repeated
    within NOISE, fewer (at least 2) once max_seconds have gone (a busy machine); None where some
    candidate's fastest pass was not repeated."""
    passes: dict[str, list[float]] = {name: [] for name in candidates}
    start = clock()
    for fn in candidates.values():
        fn()
    for rep in range(3 * repeats):
        if rep >= 2 and clock() - start > max_seconds:
            break
        if rep >= repeats and all(repeated(ms) for ms in passes.values()):
            break
        for name in (list(candidates) if rep % 2 == 0 else list(reversed(candidates))):
            t = clock()
            candidates[name]()
            passes[name].append((clock() - t) * 1e3)
    if not all(repeated(ms) for ms in passes.values()):
        return None
    return {name: min(ms) for name, ms in passes.items()}


def confirmed(measure: Callable[[int], dict[str, float] | None], rows: int, preferred: str) -> dict[str, float] | None:
    """measure(rows), where a candidate other than the preferred one must win twice: if it wins the
    first timing, a second is made and each other candidate keeps its slower result, the preferred
    its faster (a slow spell that hit only the preferred kernel's passes cannot switch the kernel)."""
    first = measure(rows)
    if first is None or decide(first, preferred) == preferred:
        return first
    second = measure(rows)
    if second is None:
        return None
    return {name: (min if name == preferred else max)(first[name], second[name]) for name in first}


def coarse_first(n: int) -> list[int]:
    """0..n-1 in bisection order (ends, middle, quarters, ...): cut short, the timed buckets still span the range."""
    order, spans = ([0, n - 1] if n > 1 else [0]), [(0, n - 1)]
    while spans:
        spans = [half for lo, hi in spans if hi - lo > 1 for half in ((lo, (lo + hi) // 2), ((lo + hi) // 2, hi))]
        order += [hi for lo, hi in spans[0::2]]
    return order


def host_key() -> str:
    """What a timing depends on besides the op: CPU, torch, threads, the kernels as built and the candidates' names
    (a cache from before a candidate was added is timed afresh)."""
    sources = [C, TORCH, PANEL, cpu_build.PREAMBLE, linear_cpu.SOURCE, nibble_linear_cpu.SOURCE, nibble_q8_cpu.SOURCE,
               int8_rows_cpu.SOURCE, paged_attention_cpu.SOURCE, panel_cpu.SOURCE, nibble_panel_cpu.SOURCE, *cpu_build.flags()]
    parts = [cpu_build.machine(), torch.__version__, str(torch.get_num_threads()), *sources]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


@dataclass
class Request:
    op: str
    rows: list[int]  # buckets(max_rows)
    preferred: str
    measure: Callable[[int], dict[str, float] | None]  # rows -> ms per candidate (None: too noisy to tell)


def plan_of(request: Request, timings: list[dict[str, float] | None]) -> Plan:
    """The Plan from each bucket's timings; an untimed bucket takes the choice of the nearest timed one below it, or
    the preferred kernel."""
    decided = [None if ms is None else decide(ms, request.preferred) for ms in timings]
    kernels, last = [], request.preferred
    for k in decided:
        last = k if k is not None else last
        kernels.append(last)
    return Plan(tuple(request.rows), tuple(kernels), tuple(timings), request.preferred)


class Timings:
    """Measured ms per (op, rows, candidate), read from and written to the JSON cache under ``path``.
    ``request`` each op, then ``plans`` times what the cache lacks, coarse buckets of every op first,
    until ``budget_s`` is spent (the rest are timed at a later start)."""

    def __init__(self, path=None, budget_s: float = BUDGET_S):
        self.path = path or cpu_build.cache_dir() / "choices.json"
        self.host, self.budget_s = host_key(), budget_s
        self.requests: list[Request] = []
        self.measured = self.skipped = 0  # buckets timed now, and left untimed (budget spent, or too noisy)
        try:
            self.entries: dict = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    def key(self, op: str, rows: int) -> str:
        return f"{self.host} {op} rows={rows}"

    def request(self, op: str, max_rows: int, preferred: str, measure: Callable[[int], dict[str, float] | None]) -> None:
        self.requests.append(Request(op, buckets(max_rows), preferred, measure))

    def plans(self) -> dict[str, Plan]:
        """The Plan of every requested op, by op, timing the missing buckets first."""
        deadline = time.monotonic() + self.budget_s
        order = sorted((rank, n, i) for n, req in enumerate(self.requests) for rank, i in enumerate(coarse_first(len(req.rows))))
        for _, n, i in order:
            req = self.requests[n]
            key = self.key(req.op, req.rows[i])
            if key in self.entries:
                continue
            if time.monotonic() > deadline:
                self.skipped += 1
                continue
            ms = confirmed(req.measure, req.rows[i], req.preferred)
            if ms is None:  # too noisy to tell: timed again at the next start
                self.skipped += 1
                continue
            self.entries[key] = ms
            self.measured += 1
        return {req.op: plan_of(req, [self.entries.get(self.key(req.op, r)) for r in req.rows]) for req in self.requests}

    def save(self) -> None:
        """Write the cache (a temporary file renamed into place: concurrent engines never see half a file)."""
        if not self.measured:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=self.path.parent, delete=False, suffix=".tmp") as f:
            json.dump(self.entries, f, indent=0, sort_keys=True)
        os.replace(f.name, self.path)
