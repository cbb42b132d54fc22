"""One readable Llama-family decoder (Llama 2/3, Mistral, Qwen2, SmolLM2).

Module names follow Hugging Face's layout, so a checkpoint's state dict loads as is.
Attention is the only op that looks across tokens; it is a function passed into ``forward``
(``DenseCausal`` here for calibration, training and perplexity; the runtime passes a paged one),
so the same weights and the same code serve every use.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from compress.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 == self.weight.dtype:  # the same numbers in one op: half the time of six at a decode row
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [D/2], with linear or Llama-3 scaling applied."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        return _llama3_scale(inv, scaling)
    return inv


def _llama3_scale(inv: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between blended.
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen = old_ctx / s["low_freq_factor"]
    high_wavelen = old_ctx / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    smooth = (old_ctx / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    blended = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, T, H, D]; cos/sin [B, T, D] broadcast over heads
    return x * cos.unsqueeze(2) + rotate_half(x) * sin.unsqueeze(2)


class DenseCausal:
    """Causal attention over the tokens of this call only: q, k, v [B, T, H(kv), D] -> [B, T, H, D].
    A backend also rotates q and k (``rotate``): the runtime's may do it in a kernel."""

    rotate = staticmethod(apply_rope)

    def __init__(self, sliding_window: int | None = None):
        self.sliding_window = sliding_window

    def __call__(self, layer: int, q, k, v) -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        T = q.shape[2]
        if self.sliding_window is None or T <= self.sliding_window:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            i = torch.arange(T, device=q.device)
            dist = i[:, None] - i[None, :]  # [T, T] query minus key position
            mask = (dist >= 0) & (dist < self.sliding_window)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.h, self.kv, self.d = layer, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.arch.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv * self.d, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.qkv = None  # the CPU runtime's q, k and v as one Linear (runtime/cpu_fusion.py), replacing the three
        # Set by Decoder.forward for the duration of a call, so that a hook on this module
        # (calibration) sees one tensor in and one out.
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.backend = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # x [B, T, C]
        if self.qkv is not None:
            q, k, v = self.qkv(x).split((self.h * self.d, self.kv * self.d, self.kv * self.d), -1)  # views of [B, T, (H + 2KVH) D]
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q, k, v = q.view(B, T, self.h, self.d), k.view(B, T, self.kv, self.d), v.view(B, T, self.kv, self.d)
        cos, sin = self.rope
        q, k = self.backend.rotate(q, cos, sin), self.backend.rotate(k, cos, sin)
        o = self.backend(self.layer, q, k, v)  # [B, T, H, D]
        return self.o_proj(o.reshape(B, T, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up = None  # the CPU runtime's gate and up as one Linear (runtime/cpu_fusion.py), replacing the two

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, -1)  # views of [B, T, 2 * MLP]
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    """Holds what HF calls ``model.*``: embeddings, blocks, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A plain attribute, not a buffer: model.to(bf16) must not round the frequencies.
        self.inv_freq = rope_inv_freq(cfg)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(positions.device)  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def prepare(self, positions: torch.Tensor, dtype: torch.dtype, backend=None) -> None:
        """Set rotary tables and the attention backend on every block before running them."""
        rope = self.rope(positions, dtype)
        backend = backend or DenseCausal(self.cfg.sliding_window)
        for block in self.model.layers:
            block.self_attn.rope, block.self_attn.backend = rope, backend

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, backend=None) -> torch.Tensor:
        """Final-norm hidden states [B, T, C] for input_ids [B, T]."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.model.embed_tokens(input_ids).to(self.model.norm.weight.dtype)  # [B, T, C]; the table may be stored narrower
        self.prepare(positions, x.dtype, backend)
        for block in self.model.layers:
            x = block(x)
        return self.model.norm(x)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, backend=None) -> torch.Tensor:
        """Logits [B, T, V] for input_ids [B, T]."""
        return self.lm_head(self.hidden(input_ids, positions, backend))
