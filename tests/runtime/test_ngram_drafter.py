"""Prompt-lookup speculation: the lookup itself, and greedy output identical to the target alone."""

import pytest

import torch

from compress.errors import UserError
from compress.runtime.ngram_drafter import NgramDrafter, lookup
from compress.runtime.sequence import SamplingParams, Sequence
from tests.runtime.conftest import GREEDY, hf_greedy, make_llm


def test_lookup_takes_the_longest_suffix_that_occurred_before():
    # the 2-gram [7, 8] occurred at 1..2 (followed by 9, 4); the 1-gram [8] last occurred at 5 (followed by 6)
    assert lookup([5, 7, 8, 9, 4, 8, 6, 7, 8], k=2) == [9, 4]


def test_lookup_takes_the_latest_occurrence_and_stops_at_k():
    assert lookup([1, 2, 3, 1, 4, 5, 6, 1], k=2) == [4, 5]
    assert lookup([9, 1, 2, 1, 3, 1], k=1) == [3]


def test_lookup_repeats_the_loop_it_found_when_few_tokens_follow():
    assert lookup([1, 2, 3, 1, 4, 5, 6, 1], k=9) == [4, 5, 6, 1, 4, 5, 6, 1, 4]  # period 4
    assert lookup([3, 3, 3, 3], k=2) == [3, 3]  # the 3-gram at 0, period 1


def test_lookup_needs_an_earlier_occurrence_with_a_token_after_it():
    assert lookup([1, 2, 3], k=3) == []
    assert lookup([4, 4], k=3) == [4, 4, 4]
    assert lookup([4], k=3) == []
    assert lookup([1, 2, 3, 4], k=3) == []


def test_proposals_append_drafts_to_decoding_sequences_only_and_their_q_is_one_hot():
    drafter = NgramDrafter(k=3, max_model_len=64, vocab_size=10, device="cpu")
    decoding, prefilling = (Sequence(i, [1, 2, 3, 1], SamplingParams(max_tokens=8), frozenset()) for i in range(2))
    decoding.num_computed = 3  # all but the last token have KV: decoding
    drafter.propose([decoding, prefilling])
    assert decoding.token_ids == [1, 2, 3, 1, 2, 3, 1] and decoding.num_draft == 3
    assert prefilling.token_ids == [1, 2, 3, 1] and prefilling.num_draft == 0
    assert torch.equal(drafter.draft_probs(decoding), torch.eye(10)[[2, 3, 1]])


@pytest.fixture(scope="module")
def repeating(hf_tiny, prompts):
    """Prompts whose last token also starts them, twice, followed by other tokens, with transformers'
    greedy continuations. The tiny random model repeats the last prompt token, so the first lookup
    (the 2-gram [c, c]) drafts the wrong tokens and the later ones (the loop) the right ones."""
    rep = [[p[-1], p[-1]] + p for p in prompts]
    return rep, [hf_greedy(hf_tiny, p, GREEDY.max_tokens) for p in rep]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_is_identical_to_the_target_alone(tiny_dir, repeating, k):
    prompts, expected = repeating
    llm = make_llm(tiny_dir, draft="ngram", num_speculative_tokens=k)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert llm.blocks.num_free == llm.blocks.num_blocks
    assert llm.spec_stats.steps > 0 and 0 < llm.spec_stats.acceptance_rate < 1


def test_a_draft_vocabulary_without_a_draft_model_is_refused(tiny_dir):
    for draft in (None, "ngram"):
        with pytest.raises(UserError, match="--draft MODEL"):
            make_llm(tiny_dir, draft=draft, draft_vocab=100)
