"""fp8 e4m3 weights chosen by GPTQ's error feedback, with a search over each row's scale. Returns tensors only.

Nearest rounding puts every weight on its closest e4m3 value on its own. GPTQ (gptq.py) rounds the columns
of W [O, I] one at a time and moves the columns not yet rounded so as to cancel the output error
(W - Q) H (W - Q)^T, H = E[x x^T] of the Linear's inputs; here the grid of row o is the e4m3 values times
its scale s_o. The scale is searched: absmax / 448 times each factor of ``FACTORS`` (a factor below 1
saturates the row's largest weights at +-448 and moves the grid's steps on the rest), each rounded by
GPTQ, and per row the candidate with the least error e H e^T wins, nearest rounding at absmax / 448
(the old result) among them: on the calibration inputs no row does worse than nearest rounding.
The stored format is nearest rounding's: e4m3 [O, I] and one scale per row [O, 1].
"""

import torch

from compress.quant import fp8
from compress.quant.gptq import error_feedback

FACTORS = (1.0, 0.97, 0.94)  # scale = absmax / 448 * factor: smaller ones won no row on SmolLM2 (docs/results/quality.md)


def output_error(e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """[O]: e_o H e_o^T for each row of the weight error e [O, I], H [I, I] (the output's mean square error)."""
    return ((e @ h) * e).sum(1)


def gptq_rows(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, prepared=None) -> torch.Tensor:
    """e4m3 values [O, I] (fp32) of w [O, I] on the grids of scale [O, 1], by GPTQ; ``prepared``: gptq.prepare(h)."""
    s = scale.float()[:, 0]  # [O]
    return error_feedback(w, h, lambda _, target: fp8.snap(target, s), prepared)


@torch.no_grad()
def fp8_gptq(w: torch.Tensor, h: torch.Tensor, prepared=None, factors=FACTORS) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn [O, I], scale [O, 1] in w's dtype) for w [O, I] whose inputs have H [I, I]: per row, the
    candidate (nearest at absmax / 448, or GPTQ at each factor's scale) with the least ``output_error``.
    ``prepared``: ``gptq.prepare(h)`` where the Linears that share H computed it already."""
    wf, hf = w.float(), h.float()
    q, scale = fp8.quantize_weight(w)
    q = q.float()  # [O, I]
    best = output_error(wf - q * scale.float(), hf)  # [O]
    for f in factors:
        cand_scale = fp8.channel_scale(w, f)  # [O, 1]
        cand = gptq_rows(w, h, cand_scale, prepared)  # [O, I]
        loss = output_error(wf - cand * cand_scale.float(), hf)  # [O]
        win = loss < best  # [O]
        q[win], scale[win], best[win] = cand[win], cand_scale[win], loss[win]
    return q.to(torch.float8_e4m3fn), scale
