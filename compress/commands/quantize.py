"""`compress quantize`: resolve, validate, calibrate, quantize, write atomically."""

import resource
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from compress import models, outdir
from compress.errors import UserError
from compress.malloc import QUANTIZE_THRESHOLD, return_freed_memory
from compress.manifest import write_manifest
from compress.model import load
from compress.quant.apply import Spec, method_spec, quantize
from compress.quant.config import QuantConfig
from compress.quant.export import INT8_METHOD, QuantizedWriter
from compress.quant.fp8 import Fp8Spec
from compress.quant.ignore import ignored_names, leave_unquantized
from compress.quant.int8 import Int8Spec
from compress.quant.moe_calib import RoutedTokens
from compress.quant.primitives import DEFAULT_GROUP_SIZES, IntSpec


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def describe(cfg: QuantConfig, spec: Spec, stats: dict) -> str:
    if isinstance(spec, Int8Spec):
        return f"int8, {stats['outlier_dims']} outlier dims over {stats['linears']} Linears, {INT8_METHOD}"
    if isinstance(spec, Fp8Spec):
        kind = "static per-tensor" if spec.static_activations else "dynamic per-token"
        return f"fp8 e4m3, {kind} activations, compressed-tensors float-quantized"
    rounding = f", {cfg.rounding} rounding" if cfg.rounding else ""
    tuned = f", {cfg.tune_iters} tuning steps in {cfg.tune_dtype}" if cfg.tune_iters else ""
    return f"{cfg.method} int{spec.bits} g{spec.group_size}{' sym' if spec.symmetric else ''}{rounding}{tuned}, {cfg.format}"


def output_dtype(cfg: QuantConfig, src: Path) -> torch.dtype:
    """--dtype, else the source checkpoint's; AutoAWQ's format is fp16 whatever the source."""
    if cfg.dtype is not None:
        return getattr(torch, cfg.dtype)
    dtype = models.checkpoint_dtype(src)
    if cfg.format == "awq" and dtype != torch.float16:
        print(f"--format awq stores float16 (AutoAWQ's gemm format); the source is {load.dtype_name(dtype)}")
    return dtype


def check_memory(decoder, cfg: QuantConfig, model: str) -> None:
    """One block in fp32 with its quantized copy and temporaries, the calibration activations, AWQ's H matrices."""
    from compress.calib import compute_device
    from compress.model import memory

    need = 3 * memory.block_bytes(decoder, torch.float32)
    if cfg.needs_calibration:
        need += 3 * cfg.calib_samples * cfg.calib_seq_len * decoder.cfg.hidden_size * 4  # a block's input, output, one recorded
    if cfg.method == "awq" and cfg.gptq:
        need += 4 * max(decoder.cfg.hidden_size, decoder.cfg.intermediate_size) ** 2 * 4  # the widest H, its factor, temporaries
    memory.require(need, compute_device(), f"quantizing {model} with {cfg.method}",
                   "use fewer --calib-samples or a shorter --calib-seq-len, or a machine with more memory")


def with_tune_dtype(cfg: QuantConfig) -> QuantConfig:
    """cfg naming the dtype that --tune-iters' steps run in on this machine, for the recipe to record."""
    if not cfg.tune_iters or cfg.tune_dtype is not None:
        return cfg
    from compress.calib import compute_device
    from compress.quant.block_tune import step_dtype

    return replace(cfg, tune_dtype=str(step_dtype(compute_device(), None)).removeprefix("torch."))


def run_quantize(model: str, cfg: QuantConfig, output: str, force: bool = False, verbose: bool = False) -> Path:
    return_freed_memory(QUANTIZE_THRESHOLD)  # freed blocks leave RSS (compress/malloc.py)
    outdir.check_target(output, force)  # fail before the slow part (an empty or unwritable -o too)
    src = models.resolve(model)
    if models.is_quantized(src):
        raise UserError(f"{model} is already quantized; quantize its unquantized source checkpoint instead")
    decoder = models.open_model(src)  # lazy: each block is read when quantized and released when written
    leave_unquantized(decoder, ignored_names(decoder, cfg.ignore))
    spec = method_spec(decoder, cfg)  # a group size or top-k that does not fit fails here, before calibration
    if isinstance(spec, IntSpec) and cfg.group_size is None and spec.group_size != DEFAULT_GROUP_SIZES[0]:
        print(f"group size {spec.group_size}: {DEFAULT_GROUP_SIZES[0]} does not divide every quantized Linear's in_features")
    dtype = output_dtype(cfg, src)
    check_memory(decoder, cfg, model)
    cfg = with_tune_dtype(cfg)
    calib = None
    if cfg.needs_calibration:
        from compress.calib import calibration_tokens

        calib = calibration_tokens(models.load_tokenizer(src), cfg)
    with outdir.staged(Path(output), force) as tmp:  # an interrupted run leaves no OUT
        start = time.perf_counter()
        writer, routed = QuantizedWriter(tmp, decoder, spec, cfg.format, dtype, src), RoutedTokens()
        quantize(decoder, cfg, calib, verbose, done=writer.block, routed=routed)
        writer.finish()
        seconds = time.perf_counter() - start
        if routed.summary():
            print(routed.summary())
        write_manifest(
            tmp,
            recipe={"quantize": asdict(cfg) | asdict(spec)},
            source={"model": model, "path": str(src)},
            stats={"quantize_seconds": round(seconds, 1), "peak_rss_mib": round(peak_rss_mib())}
            | ({"routed_tokens": routed.as_dict()} if routed.counts else {}),
            quality={},
        )
    kept = f", {len(writer.ignored)} Linears left unquantized (--ignore)" if writer.ignored else ""
    print(f"wrote {output} ({describe(cfg, spec, writer.stats)}{kept}, {load.dtype_name(writer.dtype)}) "
          f"in {seconds:.1f}s, peak RSS {peak_rss_mib():.0f} MiB")
    return Path(output)
