"""`compress quantize`: resolve, validate, calibrate, quantize, write atomically."""

import resource
import time
from dataclasses import asdict
from pathlib import Path

from compress import models, outdir
from compress.manifest import write_manifest
from compress.quant.apply import int_spec, quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def run_quantize(model: str, cfg: QuantConfig, output: str, force: bool = False, verbose: bool = False) -> Path:
    outdir.check_target(Path(output), force)  # fail before the slow part
    src = models.resolve(model)
    decoder = models.load_model(src)
    int_spec(decoder, cfg)  # a group size that does not fit fails here, before calibration
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
            recipe={"quantize": asdict(cfg) | {"group_size": spec.group_size}},
            source={"model": model, "path": str(src)},
            stats={"quantize_seconds": round(seconds, 1), "peak_rss_mib": round(peak_rss_mib())},
            quality={},
        )
    print(f"wrote {output} ({cfg.method} int{spec.bits} g{spec.group_size}{' sym' if spec.symmetric else ''}, "
          f"{cfg.format}) in {seconds:.1f}s, peak RSS {peak_rss_mib():.0f} MiB")
    return Path(output)
