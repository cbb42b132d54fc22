"""int8 outlier-split and fp8 report: outlier dims per layer type, one activation plot, perplexity.

    python -m compress.bench.int8_report --model smollm2-135m --out int8-report [--limit-tokens N]

Calibrates on C4 (``--calib-samples`` x 512 tokens), counts the outlier input dims (calibration
max |x| >= threshold) per Linear type, plots max |x| per input dim of one Linear (PNG under
--out), and prints WikiText-2 perplexity (2048-token windows) for fp32, int8 without the split
(per-token x per-row absmax), int8 with the split, the split with SmoothQuant migration (one step
per token), the split with x's steps per 32 inputs (the default of ``--method int8``), fp8 dynamic,
fp8 with static input scales, and where fp8's loss comes from: e4m3 weights alone (activations
unrounded) and e4m3 per-token activations alone.
"""

from pathlib import Path

import click
import torch

from compress import models
from compress.bench.fp8_report import fp8_activations_only, fp8_weights_only, ppl_changed
from compress.calib import calibration_tokens
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.model.arch import LAYER_LINEARS
from compress.quant.apply import quantize
from compress.quant.config import OUTLIER_THRESHOLD, SMOOTH_ALPHA, QuantConfig
from compress.quant.int8 import Int8Spec
from compress.quant.static_apply import int8_quantize


def outlier_table(model, stats: dict[str, torch.Tensor]) -> list[str]:
    """Markdown rows: per Linear type, the outlier dims per layer (mean, max, total) and max |x|."""
    rows = ["| Linear | in_features | outlier dims per layer (mean) | max | total | largest max abs(x) |", "|---|---:|---:|---:|---:|---:|"]
    for kind in LAYER_LINEARS:
        mods = [block.get_submodule(kind) for block in model.model.layers]
        counts = [m.outlier_idx.numel() for m in mods]
        peak = max(a.max().item() for name, a in stats.items() if name.endswith(kind))
        rows.append(f"| {kind} | {mods[0].in_features} | {sum(counts) / len(counts):.1f} | {max(counts)} | {sum(counts)} | {peak:.1f} |")
    return rows


def plot_absmax(absmax: torch.Tensor, name: str, threshold: float, path: Path) -> None:
    from compress.eval.report import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.bar(range(absmax.numel()), absmax.numpy(), width=1.0)
    ax.axhline(threshold, color="red", linewidth=0.8, label=f"threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set(xlabel="input dim", ylabel="calibration max |x|", title=name)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def ppl_of(src: Path, cfg: QuantConfig | None, calib, tokens, pcfg: PerplexityConfig, label: str) -> float:
    model = models.load_model(src)
    if cfg is not None:
        quantize(model, cfg, calib if cfg.needs_calibration else None)
    return perplexity(model, tokens, pcfg, desc=label)


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--out", default="int8-report", show_default=True, help="directory for the PNG")
@click.option("--limit-tokens", type=int, default=None, help="perplexity on the first N WikiText-2 tokens only")
@click.option("--calib-samples", type=int, default=32, show_default=True)
@click.option("--outlier-threshold", type=float, default=OUTLIER_THRESHOLD, show_default=True)
@click.option("--smooth-alpha", type=float, default=SMOOTH_ALPHA, show_default=True)
@click.option("--plot-layer", default=None, help="full Linear name to plot [default: the one with the largest max |x|]")
def main(model, out, limit_tokens, calib_samples, outlier_threshold, smooth_alpha, plot_layer):
    src = models.resolve(model)
    tok = models.load_tokenizer(src)
    tokens = wikitext_tokens(tok)
    pcfg = PerplexityConfig(seq_len=2048, limit_tokens=limit_tokens)
    calib = calibration_tokens(tok, QuantConfig(method="int8", calib_samples=calib_samples))

    split = models.load_model(src)
    stats = int8_quantize(split, Int8Spec(outlier_threshold, None), calib)
    plot_layer = plot_layer or max(stats, key=lambda n: stats[n].max().item())
    png = Path(out) / "int8_absmax.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    plot_absmax(stats[plot_layer], plot_layer, outlier_threshold, png)

    split_label = f"int8, split (max abs(x) >= {outlier_threshold:g})"
    smooth = QuantConfig(method="int8", outlier_threshold=outlier_threshold, smooth_alpha=smooth_alpha, act_group_size=0)
    plain = QuantConfig(method="int8", outlier_topk=0, smooth_alpha=0.0, act_group_size=0)
    blocks = QuantConfig(method="int8", outlier_threshold=outlier_threshold)
    ppl = {
        "fp32": ppl_of(src, None, calib, tokens, pcfg, "fp32"),
        "int8, no split": ppl_of(src, plain, calib, tokens, pcfg, "int8 no split"),
        split_label: perplexity(split, tokens, pcfg, desc="int8 split"),
        f"int8, split + SmoothQuant alpha {smooth_alpha:g}": ppl_of(src, smooth, calib, tokens, pcfg, "int8 smooth"),
        "int8, split, x's steps per 32 inputs (--method int8)": ppl_of(src, blocks, calib, tokens, pcfg, "int8 blocks"),
        "fp8 e4m3, dynamic per-token": ppl_of(src, QuantConfig(method="fp8"), calib, tokens, pcfg, "fp8"),
        "fp8 e4m3, static per-tensor": ppl_of(src, QuantConfig(method="fp8", static_activations=True), calib, tokens, pcfg, "fp8 static"),
        "fp8: e4m3 weights only": ppl_changed(src, fp8_weights_only, tokens, pcfg, "fp8 weights"),
        "fp8: e4m3 per-token activations only": ppl_changed(src, fp8_activations_only, tokens, pcfg, "fp8 activations"),
    }

    print(f"\n{model}: outlier dims per Linear type ({calib_samples} x 512 C4 calibration tokens, threshold {outlier_threshold:g}, no smoothing)")
    print("\n".join(outlier_table(split, stats)))
    print(f"\nmax |x| per input dim of {plot_layer}: {png}")
    scope = f"first {limit_tokens} tokens" if limit_tokens else "all tokens"
    print(f"\nWikiText-2 test, 2048-token windows, {scope}")
    print("| model | ppl | vs fp32 |")
    print("|---|---:|---:|")
    for label, p in ppl.items():
        print(f"| {label} | {p:.3f} | {100 * (p / ppl['fp32'] - 1):+.2f} % |")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
