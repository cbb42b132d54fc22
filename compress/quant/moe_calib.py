"""Calibration of mixtures of experts: every expert sees every token, and the tokens routed to each are counted.

A router sends an expert a few percent of the tokens, and some experts none at all on a small calibration set: their
statistics from the routed tokens alone would be noisy or missing. So while a block's inputs are recorded, every
expert runs on every token of the block (``SparseMoe.calibrating``, one expert's [tokens x width] at a time), its
Linears' hooks see all of them, and the block's output still takes the routed computation (llm-compressor's
"calibrate all experts"). What the router chose is counted all the same and goes to compress.json.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from statistics import median

import torch
from torch import nn

from compress.model.moe import SparseMoe, top_experts


class RoutedTokens:
    """Tokens the router sent each expert during calibration, per MoE block (by its name in the model)."""

    def __init__(self):
        self.counts: dict[str, torch.Tensor] = {}  # name -> [E] int64

    def hook(self, name: str, top_k: int):
        def count(router: nn.Module, args, logits: torch.Tensor) -> None:
            chosen = top_experts(logits, top_k)[1]  # [..., K]
            n = torch.bincount(chosen.flatten(), minlength=logits.shape[-1]).cpu()  # [E]
            self.counts[name] = self.counts.get(name, 0) + n

        return count

    def as_dict(self) -> dict[str, list[int]]:
        return {name: c.tolist() for name, c in self.counts.items()}

    def summary(self) -> str | None:
        """One line: min / median / max tokens per expert and how many got none; None without MoE blocks."""
        every = [n for c in self.counts.values() for n in c.tolist()]
        if not every:
            return None
        return (f"tokens routed per expert in calibration: min {min(every)}, median {median(every):g}, max {max(every)}; "
                f"{sum(n == 0 for n in every)} of {len(every)} experts got none (all were calibrated on every token)")


@contextmanager
def all_experts(block: nn.Module, prefix: str, routed: RoutedTokens | None) -> Iterator[None]:
    """Within: each MoE block of ``block`` runs every expert on every token (the output routed as ever) and, with
    ``routed``, counts its router's choices under ``prefix`` + its name."""
    moes = [(name, m) for name, m in block.named_modules() if isinstance(m, SparseMoe)]
    handles = [m.gate.register_forward_hook(routed.hook(prefix + name, m.top_k)) for name, m in moes] if routed else []
    for _, m in moes:
        m.calibrating = True
    try:
        yield
    finally:
        for _, m in moes:
            m.calibrating = False
        for h in handles:
            h.remove()
