"""`compress quantize --format gguf`: one GGUF file of a llama.cpp file type, written as the blocks are rounded."""

import time
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from compress import models
from compress.calib import blocks, compute_device
from compress.commands.quantize import check_memory, peak_rss_mib, with_tune_dtype
from compress.errors import UserError
from compress.gguf.export import GgufExport, rounder
from compress.gguf.family import family
from compress.gguf.types import FILE_TYPES
from compress.gguf.vocab import llama_cpp_model, tokenizer_json
from compress.gguf.writer import check_output, staged_file
from compress.malloc import QUANTIZE_THRESHOLD, return_freed_memory
from compress.quant.config import QuantConfig
from compress.quant.gguf_blocks import TYPES
from compress.quant.primitives import IntSpec


def awq_spec(base: str) -> IntSpec:
    """AWQ's search grid for a 4-bit file type: 32-weight groups, symmetric for Q4_0 (w = d (q - 8))."""
    return IntSpec(4, TYPES[base].group, TYPES[base].symmetric)


def describe(export: GgufExport) -> str:
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(export.stats["types"].items(), key=lambda kv: -kv[1]))
    return f"{export.ft.name}: {counts} tensors, {export.stats['bytes'] / 2**20:.1f} MiB of tensor data"


def run_quantize_gguf(model: str, cfg: QuantConfig, output: str, force: bool = False, verbose: bool = False) -> Path:
    return_freed_memory(QUANTIZE_THRESHOLD)
    out = Path(output).expanduser()
    check_output(out, force)  # fail before the slow part
    src = models.resolve(model)
    if models.is_quantized(src):
        raise UserError(f"{model} is already quantized; quantize its unquantized source checkpoint instead")
    decoder = models.open_model(src)
    family(decoder.cfg)
    llama_cpp_model(tokenizer_json(src))  # a tokenizer llama.cpp cannot take is refused before the slow part
    ft = FILE_TYPES[cfg.gguf_type]
    if not ft.quantized:
        print(f"--gguf-type {ft.name}: tensors are written unrounded (--method {cfg.method} does not apply)")
    check_memory(decoder, cfg, model)
    cfg = with_tune_dtype(cfg)
    calib = None
    if cfg.needs_calibration:
        from compress.calib import calibration_tokens

        calib = calibration_tokens(models.load_tokenizer(src), cfg)
    recipe = {"quantize": asdict(cfg), "source": model}
    with staged_file(out, force) as tmp:  # an interrupted run leaves no OUT
        start = time.perf_counter()
        export = GgufExport(tmp, decoder, ft, src, recipe)
        if calib is not None:
            from compress.quant.awq_apply import awq_quantize

            awq_quantize(decoder, awq_spec(ft.base), cfg, calib, verbose, done=export.block, finish=rounder(export, cfg.grid))
        else:
            bar = tqdm(blocks(decoder, compute_device(), export.block), total=decoder.cfg.num_layers, desc=ft.name, unit="block")
            for i, block in bar:
                export.round_block(i, block)
        export.finish()
        seconds = time.perf_counter() - start
    print(f"wrote {out} ({describe(export)}) in {seconds:.1f}s, peak RSS {peak_rss_mib():.0f} MiB")
    return out
