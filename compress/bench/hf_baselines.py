"""The transformers baselines of `compress bench`: static batching with generate, and continuous batching."""

import time

import torch

from compress.runtime.sequence import SamplingParams


class StepClock:
    """A logits processor that records when each generation step's logits are ready (one token per row)."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def static_batches(hf, prompts: list[list[int]], params: list[SamplingParams], batch_size: int, t0: float) -> dict[int, list[float]]:
    """generate() on batches of batch_size (left-padded, run to the batch's longest max_tokens).
    Returns each request's token times, cut to its own max_tokens (the rest is wasted work)."""
    from transformers import LogitsProcessorList

    hf.generation_config.eos_token_id = None
    times = {}
    for start in range(0, len(prompts), batch_size):
        idx = range(start, min(start + batch_size, len(prompts)))
        width = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([[0] * (width - len(prompts[i])) + prompts[i] for i in idx], device=hf.device)  # [B, T] left-padded
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in idx], device=hf.device)
        clock = StepClock()
        with torch.no_grad():
            hf.generate(ids, attention_mask=mask, max_new_tokens=max(params[i].max_tokens for i in idx), do_sample=False,
                        eos_token_id=None, pad_token_id=0, logits_processor=LogitsProcessorList([clock]))
        for i in idx:
            times[i] = clock.times[: params[i].max_tokens]
    return times


def continuous(hf, prompts: list[list[int]], params: list[SamplingParams], t0: float) -> dict[int, list[float]]:
    """transformers' own continuous batching manager, every request queued at t0.

    The manager decodes on a thread of its own that is not a daemon and waits for requests until it
    is told to stop: it is stopped and joined on every way out of here (an interrupt or an error
    included), or the process would never exit."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(p.max_tokens for p in params), eos_token_id=None, pad_token_id=0)
    manager = hf.init_continuous_batching(generation_config=config)
    manager.start()
    done = False
    try:
        for i, (p, sp) in enumerate(zip(prompts, params)):
            manager.add_request(p, request_id=str(i), max_new_tokens=sp.max_tokens, record_timestamps=True)
        times = collect(manager, len(prompts))
        done = True
    finally:
        manager.stop(block=True, hard_stop=not done)  # joins the thread; hard: drop what is left after an error
    return times


def collect(manager, n: int) -> dict[int, list[float]]:
    """Token times of n requests, by request index, as each finishes."""
    times = {}
    while len(times) < n:
        out = manager.get_result(timeout=1.0)
        if out is None and not manager.is_running():
            raise RuntimeError("transformers' continuous batching thread stopped before every request finished")
        if out is not None and out.is_finished():
            if out.error is not None:
                raise RuntimeError(f"transformers' continuous batching failed request {out.request_id}: {out.error}")
            times[int(out.request_id)] = list(out.timestamps or [])
    return times
