"""Seconds per block of a quantization method on a model's first blocks, and the whole model extrapolated.

    python -m compress.bench.first_blocks MODEL [--method awq] [--blocks 2] [--calib-samples 128] [--calib-seq-len 512]
        [--tune-iters N]

AWQ on an 8B model takes hours on a CPU; its first blocks tell the time per block and (run under
`/usr/bin/time -v`, as scale_bench does) the peak memory, which is one block's. It runs what
`compress quantize` runs (a lazy model, calibration, ``quantize`` block by block) and stops after
``--blocks`` blocks; nothing is written.
"""

import time

import click

from compress import models
from compress.calib import calibration_tokens
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig


class Enough(Exception):
    """Raised from the block callback once the requested blocks are done."""


def time_blocks(model: str, cfg: QuantConfig, blocks: int) -> tuple[list[float], int]:
    """(seconds of each of the first ``blocks`` blocks, the model's number of blocks); the first block's time
    includes the embedding of the calibration tokens."""
    src = models.resolve(model)
    decoder = models.open_model(src)
    calib = calibration_tokens(models.load_tokenizer(src), cfg) if cfg.needs_calibration else None
    times, start = [], time.perf_counter()

    def done(i, block):
        nonlocal start
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        if len(times) == blocks:
            raise Enough

    try:
        quantize(decoder, cfg, calib, done=done)
    except Enough:
        pass
    return times, decoder.cfg.num_layers


@click.command()
@click.argument("model")
@click.option("--method", type=click.Choice(["awq", "rtn", "int8", "fp8"]), default="awq", show_default=True)
@click.option("--bits", type=int, default=4, show_default=True)
@click.option("--blocks", type=int, default=2, show_default=True)
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--calib-seq-len", type=int, default=512, show_default=True)
@click.option("--tune-iters", type=int, default=0, show_default=True, help="AWQ's block-output tuning steps")
def main(model, method, bits, blocks, calib_samples, calib_seq_len, tune_iters):
    cfg = QuantConfig(method=method, bits=bits, calib_samples=calib_samples, calib_seq_len=calib_seq_len,
                      tune_iters=tune_iters)
    times, layers = time_blocks(model, cfg, blocks)
    per_block = min(times[1:] or times)  # the first block also embeds the calibration set
    tuned = f", {tune_iters} tuning steps" if tune_iters else ""
    print(f"{method} int{bits}, {calib_samples} x {calib_seq_len} calibration tokens{tuned}: "
          + ", ".join(f"block {i}: {t:.1f} s" for i, t in enumerate(times))
          + f"; {layers} blocks at {per_block:.1f} s = {layers * per_block / 60:.0f} min extrapolated", flush=True)


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)  # one line for bad input, freed memory returned as in `compress`
