"""A tiny teacher (our Decoder over a random transformers Llama) for the pruning tests."""

import pytest

from compress.model.load import load_decoder
from tests.conftest import save_hf, tiny_hf


def tiny_teacher(tmp_path, **overrides):
    """Returns (dir, Decoder) of a random 4-layer Llama: hidden 64, MLP 128, 4 heads over 2 KV heads."""
    path = save_hf(tiny_hf("llama", num_hidden_layers=4, **overrides), tmp_path / "teacher")
    return path, load_decoder(path)


@pytest.fixture
def teacher(tmp_path):
    return tiny_teacher(tmp_path)
