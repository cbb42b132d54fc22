"""int8 split (x's steps per 32 inputs, the default) and fp8 on the real SmolLM2-135M (slow): the split helps, fp8 stays close."""

import pytest

from compress.calib import calibration_tokens
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.models import load_model, load_tokenizer
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig

pytestmark = pytest.mark.slow


def test_int8_split_and_fp8_perplexity(smollm2_dir, data_dir):
    tok = load_tokenizer(smollm2_dir)
    tokens = wikitext_tokens(tok)
    pcfg = PerplexityConfig(seq_len=512, limit_tokens=1024)
    configs = {
        "split": QuantConfig(method="int8", calib_samples=4, calib_seq_len=256),
        "no split": QuantConfig(method="int8", outlier_topk=0, smooth_alpha=0.0, act_group_size=0),
        # GPTQ rounding (the default) calibrates: a small set keeps the test minutes, not the default 128 x 512 tokens' hour
        "fp8": QuantConfig(method="fp8", calib_samples=4, calib_seq_len=256),
    }
    ppl = {"fp": perplexity(load_model(smollm2_dir), tokens, pcfg)}
    for name, cfg in configs.items():
        model = load_model(smollm2_dir)
        quantize(model, cfg, calibration_tokens(tok, cfg) if cfg.needs_calibration else None)
        ppl[name] = perplexity(model, tokens, pcfg)
    assert ppl["fp"] < ppl["split"] < ppl["no split"], ppl
    assert ppl["fp8"] < ppl["fp"] * 1.1, ppl
