"""Pruned shapes: parameter counts, and the width/depth search for a parameter target."""

import math

from dataclasses import dataclass, replace

from compress.errors import UserError
from compress.model.config import ModelConfig

WIDTH_STEP = 64  # hidden and intermediate sizes stay multiples of this (or the original size)


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    num_layers: int

    @classmethod
    def of(cls, cfg: ModelConfig) -> "Shape":
        return cls(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.num_layers)

    def apply(self, cfg: ModelConfig, layers: list[int]) -> ModelConfig:
        """cfg at this shape, keeping the original layers ``layers`` (their per-layer attention types go with them)."""
        types = cfg.layer_types and tuple(cfg.layer_types[i] for i in layers)
        return replace(cfg, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                       num_heads=self.num_heads, num_kv_heads=self.num_kv_heads, num_layers=self.num_layers, layer_types=types)


def param_count(cfg: ModelConfig, shape: Shape) -> int:
    """Parameters of cfg's family at this shape: its norms, q/k norms, and biases (q/k/v where the family always has
    them or attention_bias says so, o_proj's under attention_bias). Fused projections hold the same numbers."""
    C, I, D, arch = shape.hidden_size, shape.intermediate_size, cfg.head_dim, cfg.arch
    q, kv = shape.num_heads * D, shape.num_kv_heads * D
    bias = (q + 2 * kv) * (arch.qkv_bias or cfg.attention_bias) + C * cfg.attention_bias
    qk_norms = {None: 0, "head": 2 * D, "proj": q + kv}[arch.qk_norm]  # per head: D-wide; over the projections
    attn = 2 * C * q + 2 * C * kv + bias + qk_norms
    per_layer = attn + 3 * C * I + len(arch.norms.names()) * C
    embed = cfg.vocab_size * C * (1 if cfg.tie_word_embeddings else 2)
    return embed + shape.num_layers * per_layer + C


def head_width(cfg: ModelConfig) -> int | None:
    """The hidden_size / num_heads a pruned shape must keep, None if free: transformers' Phi-3 config checks
    longrope's per-pair factor lists against hidden_size // num_attention_heads (not head_dim)."""
    return cfg.hidden_size // cfg.num_heads if "short_factor" in (cfg.rope_scaling or {}) else None


def validate(cfg: ModelConfig, shape: Shape) -> None:
    full = Shape.of(cfg)
    for name in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "num_layers"):
        value, limit = getattr(shape, name), getattr(full, name)
        if not 1 <= value <= limit:
            raise UserError(f"--{name.replace('_', '-')} {value} must be between 1 and the model's {limit}")
    if shape.hidden_size % shape.num_heads:
        raise UserError(f"--hidden-size {shape.hidden_size} must be a multiple of --num-heads {shape.num_heads} "
                        f"(transformers refuses other Llama configs)")
    if shape.num_heads % shape.num_kv_heads:
        raise UserError(f"--num-heads {shape.num_heads} must be a multiple of --num-kv-heads {shape.num_kv_heads} (GQA groups)")
    if shape.num_heads // shape.num_kv_heads > cfg.num_heads // cfg.num_kv_heads:
        raise UserError(f"--num-heads {shape.num_heads} with --num-kv-heads {shape.num_kv_heads} needs "
                        f"{shape.num_heads // shape.num_kv_heads} query heads per KV group; the model has "
                        f"{cfg.num_heads // cfg.num_kv_heads}")
    width = head_width(cfg)
    if width and shape.hidden_size != width * shape.num_heads:
        raise UserError(f"--hidden-size {shape.hidden_size} with --num-heads {shape.num_heads}: this model's longrope "
                        f"factors fix hidden-size / num-heads at {width} (transformers checks them so); "
                        f"use --hidden-size {width * shape.num_heads}")


def sizes(full: int, step: int = WIDTH_STEP) -> list[int]:
    """Candidate widths: the original and multiples of step down to half of it."""
    return sorted({full, *(s for s in range(step, full, step) if s >= full // 2)}, reverse=True)


def candidates(cfg: ModelConfig, target: int, tolerance: float = 0.02) -> list[tuple[Shape, int]]:
    """Shapes within tolerance of target params, best first.

    Minitron's findings order the search: width before depth (keep every layer if any width-only
    shape fits), attention heads kept, and among width-only shapes the one that takes the most even
    share from the hidden and the MLP width (the smallest largest relative cut). A hidden size must
    stay a multiple of the head count, as transformers requires (for SmolLM2's 9 heads and 64-wide
    steps that leaves only 576: its hidden size is not pruned).
    """
    full = Shape.of(cfg)
    hidden_step = math.lcm(WIDTH_STEP, full.num_heads)
    if target >= param_count(cfg, full):
        raise UserError(f"--target-params {target:,} is not below the model's {param_count(cfg, full):,} parameters")
    found = []
    for layers in range(full.num_layers, full.num_layers // 2 - 1, -1):
        for hidden in [full.hidden_size] if head_width(cfg) else sizes(full.hidden_size, hidden_step):
            for inter in sizes(full.intermediate_size):
                shape = Shape(hidden, inter, full.num_heads, full.num_kv_heads, layers)
                n = param_count(cfg, shape)
                if abs(n - target) <= tolerance * target:
                    cut = max(1 - hidden / full.hidden_size, 1 - inter / full.intermediate_size)
                    found.append((full.num_layers - layers, cut, shape, n))
    if not found:
        raise UserError(f"no width/depth shape within {tolerance:.0%} of --target-params {target:,}; "
                        f"give the sizes explicitly (--hidden-size, --intermediate-size, --num-layers)")
    found.sort(key=lambda f: (f[0], f[1]))
    return [(shape, n) for _, _, shape, n in found]
