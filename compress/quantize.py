"""`compress quantize`: resolve, validate, calibrate, quantize, write atomically."""

import resource
import time
from dataclasses import asdict
from pathlib import Path

from compress import models, outdir
from compress.manifest import write_manifest
from compress.quant.apply import Spec, method_spec, quantize
from compress.quant.config import QuantConfig
from compress.quant.export import INT8_METHOD, write_quantized
from compress.quant.fp8 import Fp8Spec
from compress.quant.int8 import Int8Spec
from compress.quant.primitives import DEFAULT_GROUP_SIZES, IntSpec


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def describe(cfg: QuantConfig, spec: Spec, model) -> str:
    if isinstance(spec, Int8Spec):
        dims = [len(m.outlier_idx) for m in model.modules() if hasattr(m, "outlier_idx")]
        return f"int8, {sum(dims)} outlier dims over {len(dims)} Linears, {INT8_METHOD}"
    if isinstance(spec, Fp8Spec):
        kind = "static per-tensor" if spec.static_activations else "dynamic per-token"
        return f"fp8 e4m3, {kind} activations, compressed-tensors float-quantized"
    rounding = f", {cfg.rounding} rounding" if cfg.rounding else ""
    return f"{cfg.method} int{spec.bits} g{spec.group_size}{' sym' if spec.symmetric else ''}{rounding}, {cfg.format}"


def run_quantize(model: str, cfg: QuantConfig, output: str, force: bool = False, verbose: bool = False) -> Path:
    outdir.check_target(Path(output), force)  # fail before the slow part
    src = models.resolve(model)
    decoder = models.load_model(src)
    first = method_spec(decoder, cfg)  # a group size or top-k that does not fit fails here, before calibration
    if isinstance(first, IntSpec) and cfg.group_size is None and first.group_size != DEFAULT_GROUP_SIZES[0]:
        print(f"group size {first.group_size}: {DEFAULT_GROUP_SIZES[0]} does not divide every quantized Linear's in_features")
    calib = None
    if cfg.needs_calibration:
        from compress.calib import calibration_tokens

        calib = calibration_tokens(models.load_tokenizer(src), cfg)
    with outdir.staged(Path(output), force) as tmp:  # an interrupted search leaves no OUT
        start = time.perf_counter()
        spec = quantize(decoder, cfg, calib, verbose)
        seconds = time.perf_counter() - start
        if cfg.format == "awq":
            from compress.quant.awq_format import write_awq

            write_awq(decoder, spec, tmp, src)
        else:
            write_quantized(decoder, spec, tmp, src)
        write_manifest(
            tmp,
            recipe={"quantize": asdict(cfg) | asdict(spec)},
            source={"model": model, "path": str(src)},
            stats={"quantize_seconds": round(seconds, 1), "peak_rss_mib": round(peak_rss_mib())},
            quality={},
        )
    print(f"wrote {output} ({describe(cfg, spec, decoder)}) in {seconds:.1f}s, peak RSS {peak_rss_mib():.0f} MiB")
    return Path(output)
