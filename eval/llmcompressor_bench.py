"""llm-compressor's AWQ on the same model and calibration tokens as ours, for the README.

Run where `llmcompressor` is importable (the optional `bench` extra; it pins its own
transformers, so a separate virtualenv is simplest):

    python -m compress.eval.llmcompressor_bench --model smollm2-135m --out bench-out/llmc-awq-int4

It writes a compressed-tensors checkpoint (W4A16 asymmetric, our default group size) and
prints its wall time; `compress eval` then measures its perplexity with the same code as ours.
"""

import time

import click

from compress import models
from compress.calib import calibration_tokens
from compress.model.config import ModelConfig
from compress.model.load import read_config
from compress.quant.config import QuantConfig
from compress.quant.primitives import default_group_size
from compress.roofline import linear_widths


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--out", required=True)
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--calib-seq-len", type=int, default=512, show_default=True)
def main(model, out, calib_samples, calib_seq_len):
    import datasets
    import torch
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from transformers import AutoModelForCausalLM

    src = models.resolve(model)
    tok = models.load_tokenizer(src)
    cfg = QuantConfig(method="awq", bits=4, calib_samples=calib_samples, calib_seq_len=calib_seq_len)
    ids = calibration_tokens(tok, cfg)  # the same [128, 512] tokens our AWQ calibrates on
    ds = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist()})
    group = default_group_size(linear_widths(ModelConfig.from_hf(read_config(src))))
    weights = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": group}
    recipe = [
        AWQModifier(),
        QuantizationModifier(ignore=["lm_head"], config_groups={"group_0": {"targets": ["Linear"], "weights": weights}}),
    ]
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    start = time.perf_counter()
    oneshot(model=hf, dataset=ds, recipe=recipe, num_calibration_samples=calib_samples, max_seq_length=calib_seq_len)
    seconds = time.perf_counter() - start
    hf.save_pretrained(out, save_compressed=True)
    tok.save_pretrained(out)
    print(f"llm-compressor AWQ W4A16_ASYM g{group}: {seconds:.0f} s (calibration + search + quantization)")


if __name__ == "__main__":
    from compress.cli import run_command

    run_command(main)
