"""Load test of `compress serve` on loopback: many concurrent streaming clients, a KV pool far too
small for them all (so preemption happens), and an exactness check against one-at-a-time decoding.

    python -m compress.bench.loadtest --model smollm2-135m --clients 256

The server runs in this process on a free loopback port. Every request is greedy with a fixed
length (ignore_eos), so its streamed text must equal the same request decoded alone, and its
usage must count exactly max_tokens tokens: a lost or duplicated token breaks one or the other.
"""

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import click
import httpx
from tqdm import tqdm

from compress.bench.mixed import mixed
from compress.runtime.engine import LLM
from compress.runtime.local_server import running_server
from compress.runtime.sequence import SamplingParams


@dataclass
class ClientResult:
    text: str = ""
    completion_tokens: int = -1
    ttft: float = float("nan")
    latency: float = float("nan")
    finish_reason: str | None = None
    error: str | None = None


async def one_client(http: httpx.AsyncClient, url: str, prompt: list[int], params: SamplingParams) -> ClientResult:
    body = {"prompt": prompt, "max_tokens": params.max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    out, start = ClientResult(), time.monotonic()
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as res:
            if res.status_code != 200:
                out.error = f"HTTP {res.status_code}: {(await res.aread()).decode()[:200]}"
                return out
            async for line in res.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    if out.text == "" and out.ttft != out.ttft:
                        out.ttft = time.monotonic() - start
                    out.text += chunk["choices"][0]["text"]
                    out.finish_reason = chunk["choices"][0]["finish_reason"] or out.finish_reason
                if chunk.get("usage"):
                    out.completion_tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.latency = time.monotonic() - start
    return out


async def all_clients(url: str, prompts, params) -> list[ClientResult]:
    limits = httpx.Limits(max_connections=len(prompts) + 8)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None)) as http:
        bar = tqdm(total=len(prompts), desc="clients done", unit="req")

        async def tracked(p, sp):
            result = await one_client(http, url, p, sp)
            bar.update()
            return result

        results = await asyncio.gather(*(tracked(p, sp) for p, sp in zip(prompts, params)))
        bar.close()
    return list(results)


def metric(url: str, name: str) -> float:
    line = next(ln for ln in httpx.get(url + "/metrics").text.splitlines() if ln.startswith(name + " "))
    return float(line.split()[1])


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


@dataclass
class Report:
    clients: int
    kv_blocks: int
    kv_blocks_needed: int
    completed: int = 0
    errors: int = 0
    mismatched: int = 0
    preemptions: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = 0.0
    ttft_p50_s: float = 0.0
    ttft_p99_s: float = 0.0
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    kv_blocks_used_after: int = -1
    sequential_wall_s: float = 0.0
    error_samples: list[str] = field(default_factory=list)


def pool_for(model: str, probe: LLM, prompts, params, fraction: float) -> tuple[LLM, int]:
    """An engine whose KV pool holds `fraction` of the blocks all requests need at once (at least the largest one);
    probe is an engine on the same model, for its block sizes."""
    needs = [probe.blocks.blocks_needed(len(p) + sp.max_tokens) for p, sp in zip(prompts, params)]
    blocks = max(int(sum(needs) * fraction), max(needs))
    return LLM(model, kv_cache_memory=blocks * probe.runner.block_bytes(), max_num_seqs=len(prompts)), sum(needs)


def run(model: str, clients: int, max_prompt: int, max_new: int, kv_fraction: float, seed: int) -> Report:
    probe = LLM(model, kv_cache_memory=1 << 20)
    w = mixed(clients, max_prompt, max_new, probe.vocab_size, seed)
    llm, needed = pool_for(model, probe, w.prompts, w.params, kv_fraction)
    del probe
    report = Report(clients, llm.blocks.num_blocks, needed)
    with running_server(llm, max_waiting=clients) as (url, _):
        t0 = time.monotonic()
        results = asyncio.run(all_clients(url, w.prompts, w.params))
        report.wall_s = time.monotonic() - t0
        report.kv_blocks_used_after = int(metric(url, "compress_kv_blocks_used"))
        report.preemptions = int(metric(url, "compress_num_preemptions_total"))
    t0 = time.monotonic()
    alone = [llm.generate([p], sp)[0] for p, sp in tqdm(list(zip(w.prompts, w.params)), desc="one at a time")]
    report.sequential_wall_s = time.monotonic() - t0
    ok = [r for r in results if r.error is None]
    report.errors = len(results) - len(ok)
    report.error_samples = [r.error for r in results if r.error][:5]
    report.completed = sum(r.finish_reason == "length" and r.completion_tokens > 0 for r in ok)
    report.mismatched = sum(r.error is None and (r.text != a.text or r.completion_tokens != len(a.token_ids))
                            for r, a in zip(results, alone))
    report.output_tokens = sum(r.completion_tokens for r in ok)
    report.tokens_per_s = report.output_tokens / report.wall_s
    ttfts, latencies = [r.ttft for r in ok], [r.latency for r in ok]
    report.ttft_p50_s, report.ttft_p99_s = percentile(ttfts, 50), percentile(ttfts, 99)
    report.latency_p50_s, report.latency_p99_s = percentile(latencies, 50), percentile(latencies, 99)
    return report


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--clients", type=int, default=256, show_default=True)
@click.option("--max-prompt", type=int, default=192, show_default=True)
@click.option("--max-new", type=int, default=96, show_default=True)
@click.option("--kv-fraction", type=float, default=0.1, show_default=True, help="KV pool size over what all clients need")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", default=None, help="also write the report as JSON here")
def main(model, clients, max_prompt, max_new, kv_fraction, seed, out):
    report = run(model, clients, max_prompt, max_new, kv_fraction, seed)
    text = json.dumps(asdict(report), indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
