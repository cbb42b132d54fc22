import math

import pytest
import torch

from compress.errors import UserError
from compress.eval.perplexity import PerplexityConfig, perplexity, windows
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from tests.conftest import tiny_hf


def test_windows_are_non_overlapping_and_drop_the_tail():
    w = windows(torch.arange(10), PerplexityConfig(seq_len=3))
    assert w.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert windows(torch.arange(10), PerplexityConfig(seq_len=3, limit_tokens=6)).shape == (2, 3)


def test_perplexity_is_exp_mean_nll_over_every_predicted_token():
    hf = tiny_hf("llama")
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()
    tokens = torch.randint(0, 256, (50,))
    cfg = PerplexityConfig(seq_len=16, batch_size=2)
    nll = []
    for win in tokens[:48].view(3, 16):
        with torch.no_grad():
            logp = hf(win[None]).logits[0, :-1].log_softmax(-1)
        nll += [-logp[i, win[i + 1]].item() for i in range(15)]
    assert perplexity(model, tokens, cfg) == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)


def test_bad_settings():
    with pytest.raises(UserError):
        PerplexityConfig(seq_len=1)
    with pytest.raises(UserError):
        PerplexityConfig(seq_len=2048, limit_tokens=100)
    with pytest.raises(UserError, match="fewer than one window"):
        windows(torch.arange(10), PerplexityConfig(seq_len=16))
