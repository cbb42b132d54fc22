"""Where fp8's perplexity loss comes from: e4m3 weights alone, e4m3 per-token activations alone, and the
activations of each Linear kind alone; and whether it is e4m3's subnormals or its 3-bit mantissa. With
``--per-layer``, instead: fp8 (both) everywhere but one decoder layer, for each layer, which ranks the layers worth
keeping unquantized (`compress quantize --ignore`).

    python -m compress.bench.fp8_report --model smollm2-135m [--limit-tokens N] [--per-layer]

Every row changes one thing in the unquantized model (weights stored back dense, or inputs rounded by a
forward pre-hook) and measures WikiText-2 perplexity in 2048-token windows. "3-bit mantissa, any exponent"
rounds each input to e4m3's relative precision with no range limit: where it equals the e4m3 row, a finer
or smoothed scale cannot help (the loss is the mantissa, not the exponent range).
"""

from collections.abc import Callable, Sequence
from pathlib import Path

import click
import torch

from compress import models
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens
from compress.kernels.reference import fp8_token_scale
from compress.model.arch import LAYER_LINEARS
from compress.quant.fp8 import quantize_weight, to_e4m3

MANTISSA_STEPS = 16  # e4m3: 3 stored bits + the implicit one, so frexp's mantissa in [0.5, 1) on a 1/16 grid


def e4m3_per_token(x: torch.Tensor) -> torch.Tensor:
    """x [..., I] rounded to e4m3 with the runtime's dynamic per-token scale (absmax / 448), back in x's dtype."""
    scale = fp8_token_scale(x)  # [..., 1]
    return (to_e4m3(x, scale).float() * scale).to(x.dtype)


def mantissa_only(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3's 3-bit mantissa with an unbounded exponent: no saturation, no subnormals."""
    m, e = torch.frexp(x.float())
    return torch.ldexp(torch.round(m * MANTISSA_STEPS) / MANTISSA_STEPS, e).to(x.dtype)


@torch.no_grad()
def fp8_weights_only(model, but: int | None = None) -> None:
    """Every decoder Linear's weight (but layer ``but``'s) rounded to e4m3 (per-channel scale) and stored back dense."""
    for i, block in enumerate(model.model.layers):
        for kind in LAYER_LINEARS if i != but else ():
            lin = block.get_submodule(kind)
            q, scale = quantize_weight(lin.weight)
            lin.weight.copy_(q.to(scale.dtype) * scale)


def round_inputs(model, kinds: Sequence[str], rounding: Callable[[torch.Tensor], torch.Tensor], but: int | None = None) -> None:
    """The input of every decoder Linear of ``kinds`` (but layer ``but``'s) rounded by ``rounding`` (weights untouched)."""
    for i, block in enumerate(model.model.layers):
        for kind in kinds if i != but else ():
            block.get_submodule(kind).register_forward_pre_hook(lambda _, args: (rounding(args[0]), *args[1:]))


def fp8_activations_only(model) -> None:
    """Every decoder Linear's input rounded to e4m3 per token (absmax / 448), weights untouched."""
    round_inputs(model, LAYER_LINEARS, e4m3_per_token)


def fp8_but(layer: int | None) -> Callable:
    """The change to e4m3 weights (nearest) and per-token inputs in every decoder Linear but layer ``layer``'s."""
    def change(model) -> None:
        fp8_weights_only(model, layer)
        round_inputs(model, LAYER_LINEARS, e4m3_per_token, layer)

    return change


def layer_rows(layers: int) -> dict[str, Callable]:
    """Row label -> change: fp32, fp8 everywhere, and fp8 everywhere but each layer in turn."""
    return {"fp32": lambda model: None, "fp8 weights and activations": fp8_but(None)} | {
        f"fp8 but layer {i}": fp8_but(i) for i in range(layers)}


def changes() -> dict[str, Callable]:
    """Row label -> the change it makes to a freshly loaded model."""
    rows = {
        "fp32": lambda model: None,
        "e4m3 weights only (nearest)": fp8_weights_only,
        "e4m3 per-token activations only": fp8_activations_only,
        "3-bit mantissa activations, any exponent": lambda model: round_inputs(model, LAYER_LINEARS, mantissa_only),
    }
    for kind in LAYER_LINEARS:
        rows[f"e4m3 activations of {kind} only"] = lambda model, k=kind: round_inputs(model, [k], e4m3_per_token)
    return rows


def ppl_changed(src: Path, change: Callable, tokens, pcfg: PerplexityConfig, label: str) -> float:
    """Perplexity of a freshly loaded model after ``change(model)``."""
    model = models.load_model(src)
    change(model)
    return perplexity(model, tokens, pcfg, desc=label)


def report(src: Path, pcfg: PerplexityConfig, rows: dict[str, Callable]) -> list[tuple[str, float]]:
    """(label, perplexity) for each of ``rows`` (label -> change), each on a freshly loaded model."""
    tokens = wikitext_tokens(models.load_tokenizer(src))
    return [(label, ppl_changed(src, change, tokens, pcfg, label)) for label, change in rows.items()]


def table(rows: list[tuple[str, float]], recovered: bool = False) -> list[str]:
    """Markdown rows: perplexity and its change against the first (fp32) row; with ``recovered``, also the share of
    the second row's loss that the row does not have (per-layer rows: what keeping that layer unquantized recovers)."""
    base, full = rows[0][1], rows[1][1]

    def cells(label: str, p: float) -> list[str]:
        out = [label, f"{p:.3f}", f"{100 * (p / base - 1):+.2f} %"]
        return out + [f"{(full - p) / (full - base):+.3f}" if full != base else "-"] if recovered else out

    head = ["model", "ppl", "vs fp32"] + ["loss recovered"] * recovered
    return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1),
            *("| " + " | ".join(cells(label, p)) + " |" for label, p in rows)]


@click.command()
@click.option("--model", default="smollm2-135m", show_default=True)
@click.option("--limit-tokens", type=int, default=None, help="perplexity on the first N WikiText-2 tokens only")
@click.option("--per-layer", is_flag=True, help="fp8 everywhere but one decoder layer, each layer in turn")
def main(model, limit_tokens, per_layer):
    src = models.resolve(model)
    chosen = layer_rows(models.open_model(src).cfg.num_layers) if per_layer else changes()
    rows = report(src, PerplexityConfig(seq_len=2048, limit_tokens=limit_tokens), chosen)
    scope = f"first {limit_tokens} tokens" if limit_tokens else "all tokens"
    print(f"\n{model}: WikiText-2 test, 2048-token windows, {scope}")
    print("\n".join(table(rows, recovered=per_layer)))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
