"""Runtime fixtures: engines over the tiny random checkpoint (SmolLM2's tokenizer) and transformers' greedy reference."""

import pytest
import torch

from compress.model.config import ModelConfig
from compress.model.load import read_config
from compress.runtime import LLM, SamplingParams
from compress.runtime.model_runner import kv_block_bytes


def make_llm(model_dir, blocks: int | None = None, **config) -> LLM:
    """An engine whose KV pool has exactly `blocks` blocks of 16 fp32 tokens (default: plenty)."""
    block_bytes = kv_block_bytes(ModelConfig.from_hf(read_config(model_dir)), 16, torch.float32)
    return LLM(model_dir, kv_cache_memory=(blocks or 1024) * block_bytes, **config)


def hf_greedy(hf, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' generate, greedy, never stopping early (the engine runs with ignore_eos)."""
    hf.generation_config.eos_token_id = None
    ids = torch.tensor([prompt_ids])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                      eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def run_requests(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list:
    """The prompts' Sequences, every one run to its end (their logprobs kept on them)."""
    seqs = [llm.make_sequence(p, params) for p in prompts]
    for seq in seqs:
        llm.enqueue(seq)
    while llm.has_unfinished():
        llm.step()
    return seqs


def assert_logprobs_equal(hf, seq) -> None:
    """A finished Sequence's prompt logprobs (from its second token) and sampled ones equal transformers' full forward's."""
    with torch.no_grad():
        ref = hf(torch.tensor([seq.token_ids])).logits[0].log_softmax(-1)  # [T, V]
    got = [e.logprob for e in seq.prompt_logprobs[1:]] + [e.logprob for e in seq.logprobs]
    assert got == pytest.approx([ref[p - 1, seq.token_ids[p]].item() for p in range(1, len(seq.token_ids))], abs=1e-4)


def random_prompts(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="session")
def hf_tiny(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
LENGTHS = [5, 17, 40, 3, 70]  # prompts of the engine tests: short, over a block, several blocks


@pytest.fixture(scope="session")
def prompts():
    return random_prompts(LENGTHS, 49152)


@pytest.fixture(scope="session")
def expected(hf_tiny, prompts):
    """transformers' greedy tokens for `prompts` on the tiny model."""
    return [hf_greedy(hf_tiny, p, GREEDY.max_tokens) for p in prompts]
