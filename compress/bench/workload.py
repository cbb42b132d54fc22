"""A workload (prompts and their sampling parameters) and the token times of running it on our engine.

Both of `compress bench`'s workloads, the batch sweep and the mixed one, and the load test draw
their requests as a Workload; `ours` runs one on an engine and records when each token arrives.
"""

import time
from dataclasses import dataclass

import torch

from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams


@dataclass
class Workload:
    prompts: list[list[int]]
    params: list[SamplingParams]


def ours(llm: LLM, w: Workload, t0: float) -> dict[int, list[float]]:
    """Every request of w added at once, then stepped to the end: each request's token times, by its index in w."""
    ids = [llm.add_request(p, sp) for p, sp in zip(w.prompts, w.params)]
    times = {i: [] for i in ids}
    while llm.has_unfinished():
        for out in llm.step():
            times[out.request_id].append(time.perf_counter())
    return {n: times[i] for n, i in enumerate(ids)}


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of xs (seconds) in milliseconds; nan for no values."""
    return float(torch.tensor(xs).quantile(q)) * 1e3 if xs else float("nan")
