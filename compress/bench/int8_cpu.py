"""An int8 checkpoint's Linears on CPU: the C path (``kernels/int8_outlier_cpu.py``) against the plain-torch reference,
one step per token and steps per block of 32 inputs, and the peak memory each call adds.

    OMP_NUM_THREADS=2 python -m compress.bench.int8_cpu [--shapes smollm2|llama3-8b] [--rows 1,8,64,512] [--repeats 5]

Random int8 codes with 16 outlier dims per Linear (the GPU benchmark's operands); times are the fastest of
``--repeats`` calls after one warm-up. "Temp MiB" is the most memory one op of the call allocates (torch's profiler,
the output included): the reference's fp32 (per block) or float64 (per token) copy of the weight against the C path's
output and copies of x.
"""

import time

import click
import torch

from compress.bench.cpu_kernels import SHAPES, host
from compress.bench.operands import int8_operands
from compress.kernels import int8_outlier_cpu, reference

GROUP = 32


def operands(out_f: int, in_f: int, rows: int) -> tuple:
    """x [rows, I] fp32 and the int8 Linear's operands as the GPU benchmark makes them, fp32 scales."""
    torch.manual_seed(0)
    return torch.randn(rows, in_f), *int8_operands(out_f, in_f, "cpu", torch.float32)


def fastest(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def temp_mib(call) -> float:
    """The most memory one op of the call allocates on the CPU, in MiB."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    return max((e.cpu_memory_usage for e in prof.key_averages()), default=0) / 2**20


@click.command()
@click.option("--shapes", type=click.Choice(["smollm2", "llama3-8b"]), default="smollm2", show_default=True)
@click.option("--rows", default="1,8,64,512", show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True)
def main(shapes: str, rows: str, repeats: int):
    if not int8_outlier_cpu.supports(torch.zeros(1)):
        raise click.ClickException("the C kernels do not build here (no C compiler): nothing to compare")
    click.echo(host())
    click.echo("| O x I | rows | steps | reference ms | C ms | reference / C | reference temp MiB | C temp MiB |")
    click.echo("|---|---:|---|---:|---:|---:|---:|---:|")
    for out_f, in_f, _ in SHAPES[shapes]:
        for m in (int(r) for r in rows.split(",")):
            args = operands(out_f, in_f, m)
            for group in (0, GROUP):
                ref = lambda: reference.int8_outlier_matmul(*args, act_group=group)  # noqa: E731
                ours = lambda: int8_outlier_cpu.int8_outlier_matmul(*args, act_group=group)  # noqa: E731
                a, b = fastest(ref, repeats), fastest(ours, repeats)
                steps = f"per {group}" if group else "per token"
                click.echo(f"| {out_f} x {in_f} | {m} | {steps} | {a:.2f} | {b:.2f} | {a / b:.1f}x | "
                           f"{temp_mib(ref):.1f} | {temp_mib(ours):.1f} |")


if __name__ == "__main__":
    main()
