"""One readable decoder for every family we run (Llama 2/3, Mistral, Qwen2/3, Gemma 2/3, Phi-3/4, OLMo 2,
Granite, SmolLM2, and the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE).

Module names follow Hugging Face's layout, so a checkpoint's state dict loads as is. What differs
between families is read once, when the modules are built, from ``cfg.arch`` and the config's numbers
(which norms exist and where, q/k norms, fused projections, multipliers, soft-caps): the forward
passes hold no per-family branches. Attention is the only op that looks across tokens; it is a
function passed into ``forward`` (``DenseCausal`` for calibration, training and perplexity; the runtime
passes a paged one), so the same weights and the same code serve every use.
"""

import torch
import torch.nn.functional as F
from torch import nn

from compress.model.attention import DenseCausal
from compress.model.config import ModelConfig
from compress.model.moe import SparseMoe
from compress.model.rope import Rope, make_rope

ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu}


class RMSNorm(nn.Module):
    """x / rms(x) * (offset + w). offset 0: Llama's form, cast to the input dtype before the weight;
    offset 1: Gemma's x * (1 + w), the product taken in fp32 (as transformers does for each)."""

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))  # the identity either way
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            n = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
            return (n * (self.offset + self.weight.float())).to(x.dtype)
        if x.dtype == torch.float32 == self.weight.dtype:  # the same numbers in one op: half the time of six at a decode row
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def norm(cfg: ModelConfig, dim: int | None = None) -> RMSNorm:
    return RMSNorm(dim or cfg.hidden_size, cfg.rms_norm_eps, cfg.arch.norm_offset)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer, self.h, self.kv, self.d = layer, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        arch, bias = cfg.arch, cfg.attention_bias
        qkv_bias = arch.qkv_bias or cfg.qkv_bias or bias
        widths = (self.h * self.d, self.kv * self.d, self.kv * self.d)
        if arch.fused:  # stored as one Linear (Phi-3)
            self.qkv_proj = nn.Linear(cfg.hidden_size, sum(widths), bias=qkv_bias)
        else:
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(cfg.hidden_size, w, bias=qkv_bias) for w in widths)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=bias)
        self.widths = widths
        # q/k norms: over each head's D (Qwen3, Gemma 3) or over the whole projection (OLMo 2)
        self.qk_norm = arch.qk_norm
        if arch.qk_norm == "head":
            self.q_norm, self.k_norm = norm(cfg, self.d), norm(cfg, self.d)
        elif arch.qk_norm == "proj":
            self.q_norm, self.k_norm = norm(cfg, widths[0]), norm(cfg, widths[1])
        self.qkv = None  # the CPU runtime's q, k and v as one Linear (runtime/cpu_fusion.py), replacing the three
        # Set by Decoder.forward for the duration of a call, so that a hook on this module
        # (calibration) sees one tensor in and one out.
        self.rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.backend = None

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v [B, T, H(kv) * D] of x [B, T, C]."""
        joined = self.qkv if self.qkv is not None else getattr(self, "qkv_proj", None)
        if joined is not None:
            return joined(x).split(self.widths, -1)  # views of [B, T, (H + 2KVH) D]
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # x [B, T, C]
        q, k, v = self.project(x)
        if self.qk_norm == "proj":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.view(B, T, self.h, self.d), k.view(B, T, self.kv, self.d), v.view(B, T, self.kv, self.d)
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = self.rope
        q, k = self.backend.rotate(q, cos, sin), self.backend.rotate(k, cos, sin)
        o = self.backend(self.layer, q, k, v)  # [B, T, H, D]
        return self.o_proj(o.reshape(B, T, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        C, M = cfg.hidden_size, cfg.intermediate_size
        if cfg.arch.fused:  # stored as one Linear (Phi-3): gate rows, then up rows
            self.gate_up_proj = nn.Linear(C, 2 * M, bias=False)
        else:
            self.gate_proj, self.up_proj = nn.Linear(C, M, bias=False), nn.Linear(C, M, bias=False)
        self.down_proj = nn.Linear(M, C, bias=False)
        self.act = ACTIVATIONS[cfg.hidden_act]
        self.gate_up = None  # the CPU runtime's gate and up as one Linear (runtime/cpu_fusion.py), replacing the two

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        joined = self.gate_up if self.gate_up is not None else getattr(self, "gate_up_proj", None)
        if joined is not None:
            gate, up = joined(x).chunk(2, -1)  # views of [B, T, 2 * MLP]
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(self.act(gate) * up)


class Block(nn.Module):
    """x + attn_out(attn(attn_in(x))) * r, then the same for the MLP; a norm the family lacks is the identity.
    A sparse layer holds the MoE block (moe.py) in place of the MLP, under the family's name for it."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.slots = cfg.arch.norms
        for name in self.slots.names():
            setattr(self, name, norm(cfg))
        self.self_attn = Attention(cfg, layer)
        self.ffn = cfg.arch.moe.block if cfg.is_moe(layer) else "mlp"
        setattr(self, self.ffn, SparseMoe(cfg, ACTIVATIONS[cfg.hidden_act]) if cfg.is_moe(layer) else MLP(cfg))
        self.residual_multiplier = cfg.residual_multiplier
        self.linears = cfg.layer_linears(layer)  # those quantization replaces: --ignore takes some out (quant/ignore.py)

    def _norm(self, name: str | None, x: torch.Tensor) -> torch.Tensor:
        return x if name is None else getattr(self, name)(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s, r = self.slots, self.residual_multiplier
        h = self._norm(s.attn_out, self.self_attn(self._norm(s.attn_in, x)))
        x = x + (h if r == 1.0 else h * r)
        h = self._norm(s.mlp_out, getattr(self, self.ffn)(self._norm(s.mlp_in, x)))
        return x + (h if r == 1.0 else h * r)


class Inner(nn.Module):
    """Holds what HF calls ``model.*``: embeddings, blocks, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = norm(cfg)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Plain attributes, not buffers: model.to(bf16) must not round the frequencies. [global, sliding layers' own]
        params = {"rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.partial_rotary_factor, **(cfg.rope_scaling or {})}
        with torch.device("cpu"):  # real values even when the modules are built on the meta device
            self.ropes: list[Rope] = [make_rope(p, cfg.head_dim, cfg.max_position_embeddings)
                                      for p in (params, cfg.local_rope) if p is not None]
        self.embed_scale = cfg.embed_multiplier * (cfg.hidden_size**0.5 if cfg.arch.embed_scale_sqrt else 1.0)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype, lengths: torch.Tensor | None = None, which: int = 0):
        """cos, sin [B, T, R] of rotary table ``which`` (``cfg.layer_rope``) at positions [B, T]."""
        return self.ropes[which].tables(positions, dtype, lengths)

    def backend(self) -> DenseCausal:
        return DenseCausal(self.cfg.attention())

    def prepare(self, positions: torch.Tensor, dtype: torch.dtype, backend=None, lengths: torch.Tensor | None = None) -> None:
        """Set rotary tables and the attention backend on every block before running them."""
        tables = [self.rope(positions, dtype, lengths, i) for i in range(len(self.ropes))]
        backend = backend or self.backend()
        for i, block in enumerate(self.model.layers):
            block.self_attn.rope, block.self_attn.backend = tables[self.cfg.layer_rope(i)], backend

    def embed(self, input_ids: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
        """Scaled embeddings [B, T, C] of input_ids [B, T], from ``weight`` if given (a table read apart)."""
        x = F.embedding(input_ids, weight) if weight is not None else self.model.embed_tokens(input_ids)
        # Gemma rounds sqrt(hidden) to the table's dtype, as transformers does
        return x if self.embed_scale == 1.0 else x * torch.tensor(self.embed_scale, dtype=x.dtype)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head of final-norm hidden states, with Granite's logits scaling and Gemma 2's final soft-cap."""
        out = self.lm_head(hidden)
        if self.cfg.logits_divisor != 1.0:
            out = out / self.cfg.logits_divisor
        if self.cfg.final_softcap is not None:
            out = torch.tanh(out / self.cfg.final_softcap) * self.cfg.final_softcap
        return out

    def hidden(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, backend=None,
               lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Final-norm hidden states [B, T, C] for input_ids [B, T]."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        x = self.embed(input_ids).to(self.model.norm.weight.dtype)  # [B, T, C]; the table may be stored narrower
        self.prepare(positions, x.dtype, backend, lengths)
        for block in self.model.layers:
            x = block(x)
        return self.model.norm(x)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor | None = None, backend=None) -> torch.Tensor:
        """Logits [B, T, V] for input_ids [B, T]."""
        return self.logits(self.hidden(input_ids, positions, backend))
