"""llm-compressor's AWQ on the same model and calibration tokens as ours (docs/results/quality.md).

Run where `llmcompressor` is importable (the optional `bench` extra; it pins its own
transformers, so a separate virtualenv is simplest):

    python -m compress.bench.vs_llmcompressor --model smollm2-135m --out bench-out/llmc-awq-int4

It writes ours (`compress quantize --method awq --bits 4`, run in a process of its own) to
OUT/compress, then llm-compressor's compressed-tensors checkpoint (W4A16 asymmetric, our default
group size, the same calibration tokens) to OUT/llmcompressor in this process, and prints both
wall times and both WikiText-2 perplexities, measured by the same code (our loader reads either
checkpoint). Each tool starts in a fresh process: on an H200, ours took 12.9 s in a process of
its own and 91.6 s in one where llm-compressor had run before (docs/results/gpu-runs.md).
"""

import subprocess
import sys
import time
from pathlib import Path

import click

from compress import models
from compress.calib import calibration_tokens
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.model.config import ModelConfig
from compress.model.load import read_config
from compress.quant.config import QuantConfig
from compress.quant.primitives import default_group_size
from compress.roofline import linear_widths


def time_ours(model: str, out: Path, calib_samples: int, calib_seq_len: int) -> float:
    """Wall seconds of `compress quantize --method awq --bits 4` in a child process (load, calibration, write)."""
    cmd = [sys.executable, "-m", "compress.cli", "quantize", model, "--method", "awq", "--bits", "4", "--calib-samples",
           str(calib_samples), "--calib-seq-len", str(calib_seq_len), "-o", str(out), "--force"]
    start = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - start


def _no_pinning() -> None:
    """llm-compressor 0.14 pins its cached block inputs for faster host-to-GPU copies, which
    raises on a machine without an accelerator; there a copy is never made, so skip the pin."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--out", required=True)
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--calib-seq-len", type=int, default=512, show_default=True)
@click.option("--limit-tokens", type=int, default=None, help="perplexity on the first N WikiText-2 tokens only")
def main(model, out, calib_samples, calib_seq_len, limit_tokens):
    from llmcompressor import oneshot  # before datasets: the other order fails in a venv over system packages

    import datasets
    import torch
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
    if not torch.cuda.is_available():
        _no_pinning()
    theirs, ours = Path(out) / "llmcompressor", Path(out) / "compress"
    seconds = {"compress AWQ": time_ours(model, ours, calib_samples, calib_seq_len)}
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    start = time.perf_counter()
    oneshot(model=hf, dataset=ds, recipe=recipe, num_calibration_samples=calib_samples, max_seq_length=calib_seq_len)
    seconds["llm-compressor AWQ"] = time.perf_counter() - start
    hf.save_pretrained(theirs, save_compressed=True)
    tok.save_pretrained(theirs)
    del hf

    tokens = wikitext_tokens(tok)
    pcfg = PerplexityConfig(seq_len=2048, limit_tokens=limit_tokens)
    ppl = {"fp32": perplexity(models.load_model(src), tokens, pcfg, desc="fp32")}
    for label, path in zip(seconds, (ours, theirs)):
        ppl[label] = perplexity(models.load_model(path), tokens, pcfg, desc=label)
    scope = f"first {limit_tokens} tokens" if limit_tokens else "all tokens"
    print(f"\nAWQ int4 (W4A16 asymmetric, group size {group}), {calib_samples} x {calib_seq_len} C4 calibration tokens; WikiText-2 {scope}")
    print("| method | wall s | ppl | gap to fp32 |")
    print("|---|---:|---:|---:|")
    print(f"| fp32 | - | {ppl['fp32']:.3f} | +0.000 |")
    for label, sec in seconds.items():
        print(f"| {label} | {sec:.0f} | {ppl[label]:.3f} | {ppl[label] - ppl['fp32']:+.3f} |")
    print(f"wall time compress / llm-compressor = {seconds['compress AWQ'] / seconds['llm-compressor AWQ']:.2f}")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
