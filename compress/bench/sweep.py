"""`compress bench --workload batches`: B requests of identical length at once, for each batch size B.

Every request of a batch arrives at t0 with a prompt of the same length (random token ids, different
for each request, so no prefix is shared) and asks for the same number of tokens (greedy,
ignore_eos). TTFT is first-token time minus t0 (the whole batch's prefill, chunked by the token
budget); ITL is the gap between successive tokens of a request; decode tok/s counts the tokens
produced after every request has its first token, over that time: steps that decode the whole
batch, which is the step the roofline bounds. Peak RSS is the process's, sampled during the batch.
"""

import random
import time
from dataclasses import dataclass

from compress.bench.peak_rss import PeakRSS
from compress.bench.workload import Workload, ours, pct
from compress.errors import UserError
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams


@dataclass(frozen=True)
class SweepConfig:
    batch_sizes: tuple[int, ...] = (1, 8, 32)
    prompt_len: int = 64
    new_tokens: int = 64
    repeats: int = 1  # runs of each batch size; the fastest is kept (the others lost time to other work)
    seed: int = 0

    def __post_init__(self):
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise UserError(f"--batch-sizes must be positive integers, got {','.join(map(str, self.batch_sizes))}")
        if self.prompt_len < 1:
            raise UserError(f"--prompt-len must be at least 1, got {self.prompt_len}")
        if self.new_tokens < 2:
            raise UserError(f"--new-tokens must be at least 2 (inter-token latency needs two tokens), got {self.new_tokens}")
        if self.repeats < 1:
            raise UserError(f"--repeats must be at least 1, got {self.repeats}")

    @property
    def context(self) -> int:
        """Mean length of a sequence over its decode steps: the KV cache a step reads per sequence."""
        return self.prompt_len + self.new_tokens // 2

    def kv_cache_bytes(self, kv_per_token: int, block_size: int = 16) -> int:
        """A KV pool that holds every request of the largest batch at once (so nothing is preempted)."""
        blocks = max(self.batch_sizes) * -(-(self.prompt_len + self.new_tokens) // block_size)
        return blocks * block_size * kv_per_token


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise UserError(f"--batch-sizes takes comma-separated integers such as 1,8,32, got '{text}'") from None


@dataclass(frozen=True)
class BatchResult:
    batch: int
    tokens: int  # output tokens of the whole batch
    ttft50: float  # ms
    itl50: float  # ms
    itl99: float  # ms
    decode_tok_s: float
    peak_rss: float  # MiB, the whole process
    preemptions: int


def batch_workload(batch: int, cfg: SweepConfig, vocab: int, run: int = 0) -> Workload:
    """Prompts of their own for every (seed, batch, run): a repeat must not find the last run's blocks in the prefix cache."""
    rng = random.Random(f"{cfg.seed}-{batch}-{run}")
    prompts = [[rng.randrange(vocab) for _ in range(cfg.prompt_len)] for _ in range(batch)]
    return Workload(prompts, [SamplingParams(max_tokens=cfg.new_tokens, temperature=0, ignore_eos=True)] * batch)


def decode_tok_s(times: list[list[float]]) -> float:
    """Tokens produced after the last first token, per second until the last token."""
    start, end = max(t[0] for t in times), max(t[-1] for t in times)
    return sum(x > start for t in times for x in t) / (end - start)


def measure_batch(llm: LLM, batch: int, cfg: SweepConfig, run: int = 0) -> BatchResult:
    w = batch_workload(batch, cfg, llm.vocab_size, run)
    preempted = llm.scheduler.num_preemptions
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        times = list(ours(llm, w, t0).values())
    itl = [b - a for t in times for a, b in zip(t, t[1:])]
    return BatchResult(batch, sum(map(len, times)), pct([t[0] - t0 for t in times], 0.5), pct(itl, 0.5), pct(itl, 0.99),
                       decode_tok_s(times), rss.peak, llm.scheduler.num_preemptions - preempted)


def warm_up(llm: LLM, cfg: SweepConfig) -> None:
    """A batch of two short requests, so that the first timed batch does not pay for first-call allocations."""
    measure_batch(llm, 2, SweepConfig((2,), min(cfg.prompt_len, 16), 4, seed=cfg.seed + 1))


def sweep(llm: LLM, cfg: SweepConfig) -> list[BatchResult]:
    """One BatchResult per batch size (the fastest decode of cfg.repeats runs), after a warm-up batch."""
    warm_up(llm, cfg)
    return [max((measure_batch(llm, b, cfg, run) for run in range(cfg.repeats)), key=lambda r: r.decode_tok_s)
            for b in cfg.batch_sizes]
