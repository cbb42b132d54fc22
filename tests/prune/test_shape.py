"""The shape search and its bad input."""

import pytest

from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.prune.shape import Shape, candidates, param_count, validate

SMOLLM2 = ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, tie_word_embeddings=True)


def test_param_count_of_smollm2_is_the_published_135m():
    assert param_count(SMOLLM2, Shape.of(SMOLLM2)) == 134_515_008


def test_candidates_hit_the_target_and_prefer_width_to_depth():
    found = candidates(SMOLLM2, 95_000_000)
    assert all(abs(n - 95e6) <= 0.02 * 95e6 for _, n in found)
    best, _ = found[0]
    assert best.num_layers == 30 and best.num_heads == 9
    assert any(s.num_layers < 30 for s, _ in found)


def test_bad_shapes_are_user_errors():
    with pytest.raises(UserError, match="not below"):
        candidates(SMOLLM2, 200_000_000)
    with pytest.raises(UserError, match="multiple of --num-kv-heads"):
        validate(SMOLLM2, Shape(576, 1536, 8, 3, 30))
    with pytest.raises(UserError, match="multiple of --num-heads"):
        validate(SMOLLM2, Shape(512, 1536, 9, 3, 30))  # transformers refuses hidden % heads != 0
    assert all(s.hidden_size % 9 == 0 for s, _ in candidates(SMOLLM2, 95_000_000))
    with pytest.raises(UserError, match="between 1 and"):
        validate(SMOLLM2, Shape(640, 1536, 9, 3, 30))
