import pytest
import torch

from compress.model.config import ModelConfig
from compress.model.load import build, load_decoder, load_weights
from tests.conftest import tiny_hf

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def ours(hf):
    return load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 4}),
        ("llama", {"rope_scaling": LLAMA3_ROPE}),
        ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
        ("qwen2", {}),
        ("mistral", {"sliding_window": 16}),
    ],
)
def test_logits_equal_transformers(kind, overrides):
    hf = tiny_hf(kind, **overrides)
    ids = torch.randint(0, 256, (3, 40))
    with torch.no_grad():
        diff = (hf(ids).logits - ours(hf)(ids)).abs().max().item()
    assert diff <= 1e-4


def test_sliding_window_changes_long_sequences():
    # The window must really mask: the same weights without it give other logits past the window.
    hf = tiny_hf("mistral", sliding_window=8)
    model = ours(hf)
    ids = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        windowed = model(ids)
        model.cfg.sliding_window = None
        full = model(ids)
    assert torch.allclose(windowed[:, :8], full[:, :8], atol=1e-6)
    assert (windowed[:, 16:] - full[:, 16:]).abs().max() > 1e-3


def test_explicit_positions_match_implicit():
    model = ours(tiny_hf("llama"))
    ids = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        a = model(ids)
        b = model(ids, positions=torch.arange(10).expand(2, 10))
    assert torch.equal(a, b)


@pytest.mark.slow
def test_smollm2_logits_equal_transformers(smollm2_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    hf = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    model = load_decoder(smollm2_dir)
    for prompt in ["The capital of France is", "def fibonacci(n):\n    ", "Quantization makes models smaller because"]:
        ids = torch.tensor([tok(prompt).input_ids])
        with torch.no_grad():
            assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-4
