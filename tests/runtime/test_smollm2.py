"""The real SmolLM2-135M: prompts of different lengths batched in one engine give transformers' greedy tokens."""

import pytest
import torch

from compress.runtime import LLM, SamplingParams
from tests.runtime.conftest import hf_greedy

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the foot of the mountains, there lived an old clockmaker who "
    "had never left the valley. Every morning he opened his shop, wound the clocks on the wall, and",
    "Q: What is 12 times 7?\nA:",
    "Photosynthesis is the process by which green plants, algae and some bacteria convert light energy into "
    "chemical energy. During this process, carbon dioxide and water are turned into glucose and oxygen. The "
    "light-dependent reactions take place in the thylakoid membranes, while the Calvin cycle happens in the "
    "stroma. In summary,",
]


PARAMS = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    return [hf_greedy(hf, tok.encode(p), PARAMS.max_tokens) for p in PROMPTS]


@pytest.mark.slow
def test_batched_greedy_equals_transformers(smollm2_dir, expected):
    llm = LLM(smollm2_dir, kv_cache_memory=128 << 20, max_num_batched_tokens=64)  # chunks the long prompts
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == expected
    assert llm.blocks.num_free == llm.blocks.num_blocks


@pytest.mark.slow
def test_speculative_greedy_with_a_poor_draft_equals_transformers(smollm2_dir, tiny_dir, expected):
    # A random 2-layer draft with SmolLM2's tokenizer: nearly every draft token is rejected and rolled back.
    llm = LLM(smollm2_dir, draft=tiny_dir, num_speculative_tokens=4, kv_cache_memory=128 << 20, max_num_batched_tokens=64)
    assert [o.token_ids for o in llm.generate(PROMPTS, PARAMS)] == expected
    assert llm.spec_stats.steps > 0
    assert llm.blocks.num_free == llm.blocks.num_blocks and llm.drafter.blocks.num_free == llm.drafter.blocks.num_blocks
