"""`compress bench MODEL --workload mixed`: our engine vs transformers on one seeded workload.

Every request arrives at t0. TTFT is first-token time minus t0; inter-token latency is the gap
between successive tokens of a request; tok/s counts the tokens requests asked for over the
phase's wall time; peak memory is the process RSS high-water mark sampled during the phase.
"""

import random
import time

import torch

from compress.bench import hf_baselines
from compress.bench.peak_rss import PeakRSS
from compress.bench.workload import Workload, ours, pct
from compress.errors import UserError
from compress.runtime.engine import LLM
from compress.runtime.sequence import SamplingParams


def check_mixed(num_requests: int, max_prompt: int, max_new: int) -> None:
    if num_requests < 1 or max_prompt < 16 or max_new < 16:
        raise UserError("bench needs --requests >= 1, --max-prompt >= 16 and --max-new >= 16")


def mixed(num_requests: int, max_prompt: int, max_new: int, vocab: int, seed: int = 0) -> Workload:
    check_mixed(num_requests, max_prompt, max_new)
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(16, max_prompt))] for _ in range(num_requests)]
    params = [SamplingParams(max_tokens=rng.randint(16, max_new), temperature=0, ignore_eos=True) for _ in range(num_requests)]
    return Workload(prompts, params)


def summary(name: str, times: dict[int, list[float]], t0: float, wall: float, peak: float) -> dict:
    ttft = [t[0] - t0 for t in times.values() if t]
    itl = [b - a for t in times.values() for a, b in zip(t, t[1:])]
    tokens = sum(len(t) for t in times.values())
    return dict(name=name, tok_s=tokens / wall, ttft50=pct(ttft, 0.5), ttft99=pct(ttft, 0.99),
                itl50=pct(itl, 0.5), itl99=pct(itl, 0.99), peak=peak, tokens=tokens, wall=wall)


def measure(name: str, run, w: Workload) -> dict:
    with PeakRSS() as rss:
        t0 = time.perf_counter()
        times = run(w, t0)
        wall = time.perf_counter() - t0
    return summary(name, times, t0, wall, rss.peak)


def decode_rate(token_times: list[float]) -> float:
    return (len(token_times) - 1) / (token_times[-1] - token_times[0])


def bs1(llm: LLM, hf, new_tokens: int = 128) -> tuple[float, float]:
    """Decode tok/s of one request (16-token prompt): ours, transformers."""
    w = Workload([list(range(1000, 1016))], [SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)])
    t_ours = ours(llm, w, 0.0)[0]
    t_hf = hf_baselines.static_batches(hf, w.prompts, w.params, 1, 0.0)[0]
    return decode_rate(t_ours), decode_rate(t_hf)


def table(rows: list[dict]) -> str:
    head = "| system | tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | peak RSS (MiB) | the first row is |\n|---|---|---|---|---|---|"
    base = rows[0]["tok_s"]
    lines = [f"| {r['name']} | {r['tok_s']:.1f} | {r['ttft50']:.0f} / {r['ttft99']:.0f} | {r['itl50']:.1f} / {r['itl99']:.1f} "
             f"| {r['peak']:.0f} | {base / r['tok_s']:.2f}x faster |" for r in rows]
    return "\n".join([head, *lines])


def run_mixed(engines: list[tuple[str, LLM]], model_dir, num_requests: int, max_prompt: int, max_new: int,
              with_hf: bool) -> None:
    """The mixed workload on each (name, engine), then transformers on model_dir (the first engine's model)."""
    from transformers import AutoModelForCausalLM

    llm = engines[0][1]
    w = mixed(num_requests, max_prompt, max_new, llm.vocab_size)
    print(f"mixed workload: {num_requests} requests, prompts 16-{max_prompt}, max_tokens 16-{max_new} (seed 0), "
          f"{torch.get_num_threads()} threads, {llm.config.device} {llm.config.dtype}", flush=True)
    rows = []
    for n, (name, engine) in enumerate(engines):
        ours(engine, mixed(2, 32, 16, engine.vocab_size, seed=1), 0.0)  # warm-up
        preempted = engine.scheduler.num_preemptions
        rows.append(measure("compress runtime" + (f": {name}" if n else ""), lambda w, t0: ours(engine, w, t0), w))
        print(f"runtime ({name}): {engine.scheduler.num_preemptions - preempted} preemptions", flush=True)
    if with_hf:
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        rows.append(measure("transformers generate, static batches of 16", lambda w, t0: hf_baselines.static_batches(hf, w.prompts, w.params, 16, t0), w))
        rows.append(measure("transformers continuous batching", lambda w, t0: hf_baselines.continuous(hf, w.prompts, w.params, t0), w))
    print(table(rows))
    if with_hf:
        ours_rate, hf_rate = bs1(llm, hf)
        print(f"bs=1 decode: compress {ours_rate:.1f} tok/s, transformers {hf_rate:.1f} tok/s ({ours_rate / hf_rate:.2f}x)")
