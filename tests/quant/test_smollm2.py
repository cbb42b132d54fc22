"""Real-model checks on SmolLM2-135M (slow: a few minutes on 2 CPU cores)."""

import pytest
import torch

from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.models import load_model, load_tokenizer
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized

pytestmark = pytest.mark.slow


def test_transformers_loads_smollm2_int4(tmp_path, smollm2_dir):
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    model = load_model(smollm2_dir)
    spec = quantize(model, QuantConfig(method="rtn", bits=4))
    assert spec.group_size == 64  # 576 is not a multiple of 128
    write_quantized(model, spec, tmp_path, smollm2_dir)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, quantization_config=CompressedTensorsConfig(dequantize=True))
    ids = torch.tensor([load_tokenizer(smollm2_dir)("Small models can still be useful").input_ids])
    with torch.no_grad():
        assert (hf(ids).logits - model(ids)).abs().max().item() <= 1e-3


def test_perplexity_orders_fp_int4_int3(smollm2_dir, data_dir):
    tokens = wikitext_tokens(load_tokenizer(smollm2_dir))
    cfg = PerplexityConfig(seq_len=1024, limit_tokens=2048)
    ppl = {"fp": perplexity(load_model(smollm2_dir), tokens, cfg)}
    for bits in (4, 3):
        model = load_model(smollm2_dir)
        quantize(model, QuantConfig(method="rtn", bits=bits))
        ppl[bits] = perplexity(model, tokens, cfg)
    assert 10 < ppl["fp"] < 40  # SmolLM2-135M is near 19 on WikiText-2 at 2048 tokens
    assert ppl["fp"] < ppl[4] < ppl[3]
