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


@pytest.mark.slow
def test_batched_greedy_equals_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM

    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    llm = LLM(smollm2_dir, kv_cache_memory=128 << 20, max_num_batched_tokens=64)  # chunks the long prompts
    outs = llm.generate(PROMPTS, params)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    for prompt, out in zip(PROMPTS, outs):
        assert out.token_ids == hf_greedy(hf, llm.tokenizer.encode(prompt), params.max_tokens), prompt
    assert llm.blocks.num_free == llm.blocks.num_blocks
