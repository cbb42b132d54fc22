"""`compress bench MODEL --draft D [--draft D2 ...]`: speculative decoding against the target alone, in one run.

Prompts are the openings of real documents (the C4 calibration set under $COMPRESS_DATA_DIR), since
how often a draft agrees with the target depends on the text. Decoding is greedy by default, so
every speculative run must reproduce the target's tokens exactly; the table says whether it did.
With a temperature the requests sample (seeded; the same tokens are not expected, the same
distribution is, which the tests check), which shows what speculation gains off greedy loops. For
each batch size the target alone runs first, then each draft, so the ratios compare neighbours in
time on a noisy machine.
"""

import time

from compress.bench.sweep import SweepConfig
from compress.calib import read_texts
from compress.errors import UserError
from compress.runtime.engine import LLM
from compress.runtime.ngram_drafter import NGRAM
from compress.runtime.output import RequestOutput
from compress.runtime.sequence import SamplingParams
from compress.runtime.speculative import SpecStats


def text_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """The first `length` tokens of the first n documents that have them."""
    prompts = []
    for text in read_texts(None):
        ids = tokenizer.encode(text)
        if len(ids) >= length:
            prompts.append(ids[:length])
        if len(prompts) == n:
            return prompts
    raise UserError(f"the C4 calibration set has fewer than {n} documents of {length} tokens")


def timed(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list[RequestOutput]]:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    return time.perf_counter() - t0, outs


def run_spec_bench(model: str, drafts: list[str], k: int, sweep: SweepConfig, engine: dict, temperature: float = 0.0) -> list[dict]:
    """Rows of the table: per batch size of sweep, the target alone then each draft (sweep.new_tokens each)."""
    plain = {key: value for key, value in engine.items() if key != "draft_vocab"}  # for engines without a draft model
    target = LLM(model, **plain)
    engines = {d: LLM(model, draft=d, num_speculative_tokens=k, **(plain if d == NGRAM else engine)) for d in drafts}
    prompts = text_prompts(target.tokenizer, max(sweep.batch_sizes), sweep.prompt_len)
    params = [SamplingParams(max_tokens=sweep.new_tokens, temperature=temperature, seed=i, ignore_eos=True)
              for i in range(len(prompts))]
    for llm in (target, *engines.values()):
        llm.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0))  # warm-up
    rows = []
    for batch in sweep.batch_sizes:
        wall, base = timed(target, prompts[:batch], params[:batch])
        base_tok_s = batch * sweep.new_tokens / wall
        rows.append(dict(draft="none (target alone)", batch=batch, tok_s=base_tok_s, speedup=1.0))
        for name, llm in engines.items():
            llm.spec_stats = SpecStats(k)
            wall, outs = timed(llm, prompts[:batch], params[:batch])
            tok_s = batch * sweep.new_tokens / wall
            rows.append(dict(draft=name, batch=batch, tok_s=tok_s, speedup=tok_s / base_tok_s,
                             acceptance=llm.spec_stats.acceptance(), tokens_per_step=llm.spec_stats.tokens_per_step,
                             identical=[o.token_ids for o in outs] == [o.token_ids for o in base] if temperature == 0 else None))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| draft | batch | tok/s | vs target alone | acceptance by draft position | tokens per step | same tokens |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "acceptance" not in r:
            lines.append(f"| {r['draft']} | {r['batch']} | {r['tok_s']:.1f} | 1.00x | - | 1.00 | - |")
            continue
        acc = " / ".join(f"{a:.2f}" for a in r["acceptance"])
        same = "-" if r["identical"] is None else "yes" if r["identical"] else "NO"
        lines.append(f"| {r['draft']} | {r['batch']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | {acc} | {r['tokens_per_step']:.2f} | {same} |")
    return "\n".join(lines)
