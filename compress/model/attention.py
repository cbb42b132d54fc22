"""Attention math shared by every backend: scaled dot-product attention with an optional tanh soft-cap
(Gemma 2) and a given scale, and the dense causal backend used for calibration, training and perplexity."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from compress.model.rope import apply_rope

QUERY_CHUNK = 256  # soft-capped attention materializes [H, chunk, keys] scores, not [H, T, T]


@dataclass(frozen=True)
class AttentionSpec:
    """How each layer attends: ``windows[layer]`` (None: every earlier token; no entries: None everywhere),
    the score scale (None: D ** -0.5) and the tanh soft-cap of the scores (None: none)."""

    windows: tuple[int | None, ...] = ()
    scale: float | None = None
    softcap: float | None = None

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if self.windows else None

    def plain(self) -> bool:
        """Causal attention over every earlier token, no soft-cap: what every attention kernel runs."""
        return self.softcap is None and all(w is None for w in self.windows)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float | None,
           softcap: float | None) -> torch.Tensor:
    """q [B, H, Tq, D], k/v [B, KVH, Tk, D] -> [B, H, Tq, D]. ``mask``: bool, True where a key is seen
    (broadcast to [B, H, Tq, Tk]); ``causal``: Tq == Tk and the lower triangle is seen."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [B, H, Tk, D]
    if causal:
        n = q.shape[2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    out = []
    for lo in range(0, q.shape[2], QUERY_CHUNK):
        scores = q[:, :, lo:lo + QUERY_CHUNK] @ k.transpose(-1, -2) * scale  # [B, H, c, Tk]
        scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            m = mask[..., lo:lo + QUERY_CHUNK, :] if mask.shape[-2] > 1 else mask
            scores = scores.masked_fill(~m, float("-inf"))
        out.append(torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype) @ v)
    return torch.cat(out, 2)


def window_mask(query_pos: torch.Tensor, context: int, window: int | None) -> torch.Tensor:
    """[n, context] bool: key j seen by the query at position i when j <= i and i - j < window."""
    i = query_pos[:, None]
    j = torch.arange(context, device=query_pos.device)[None]
    mask = j <= i
    return mask & (i - j < window) if window is not None else mask


class DenseCausal:
    """Causal attention over the tokens of this call only: q, k, v [B, T, H(kv), D] -> [B, T, H, D].
    A backend also rotates q and k (``rotate``): the runtime's may do it in a kernel."""

    def __init__(self, spec: AttentionSpec = AttentionSpec()):
        self.spec = spec

    rotate = staticmethod(apply_rope)

    def __call__(self, layer: int, q, k, v) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        T, window, spec = q.shape[2], self.spec.window(layer), self.spec
        if window is None or T <= window:
            out = attend(q, k, v, None, True, spec.scale, spec.softcap)
        else:
            mask = window_mask(torch.arange(T, device=q.device), T, window)
            out = attend(q, k, v, mask, False, spec.scale, spec.softcap)
        return out.transpose(1, 2)
