"""Sizes, KV-cache cost and the decode roofline of a model: the numbers behind `compress info`.

A decode step at batch B reads every weight once and each sequence's KV cache once, and does
2 FLOPs per weight per token plus the attention dot products. Its arithmetic intensity
(FLOPs / bytes) against a GPU's ridge point (peak FLOP/s / bandwidth) says which limit binds;
the bound on tokens/s is B / max(bytes / bandwidth, FLOPs / peak).
"""

from dataclasses import dataclass

import torch

from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.quant.primitives import default_group_size


@dataclass(frozen=True)
class GPU:
    name: str
    tflops: float  # dense fp16/bf16 tensor-core peak, fp32 accumulate
    tbps: float  # memory bandwidth, TB/s


GPUS = {
    "h100": GPU("H100 SXM5 80GB", 989.4, 3.35),  # NVIDIA H100 Tensor Core GPU datasheet
    "h200": GPU("H200 SXM 141GB", 989.4, 4.8),  # NVIDIA H200 Tensor Core GPU datasheet
    "a100": GPU("A100 SXM4 80GB", 312.0, 2.039),  # NVIDIA A100 datasheet
    "rtx4090": GPU("GeForce RTX 4090", 165.2, 1.008),  # NVIDIA Ada Lovelace architecture whitepaper
}


@dataclass(frozen=True)
class Format:
    """Bytes per weight of the decoder Linears; embeddings and lm_head stay fp16 in every format."""

    name: str
    weight_bits: int
    group_size: int | None  # None: one scale per output row
    zero_point: bool


def formats(cfg: ModelConfig) -> tuple[Format, ...]:
    """The formats we export, int4/int3 at the group size `compress quantize` picks by default."""
    g = default_group_size(linear_widths(cfg)) or cfg.hidden_size
    return (
        Format("fp16", 16, None, False),
        Format("int8", 8, None, False),
        Format("fp8", 8, None, False),
        Format("int4", 4, g, True),
        Format("int3", 3, g, True),
    )


def linear_widths(cfg: ModelConfig) -> set[int]:
    moe = () if cfg.moe is None else (cfg.moe.width, *((cfg.moe.shared_width,) if cfg.moe.shared_width else ()))
    return {cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size, *moe}


# Where each parameter of the decoder counts, by a part of its name (first match): q/k norms are norms; a MoE block's
# routed experts are "experts", its router, shared expert and shared expert gate "mlp" (every token reads them).
PARTS = (("embedding", "model.embed_tokens."), ("norms", "norm"), ("attention", ".self_attn."), ("experts", ".experts."),
         ("mlp", ".mlp."), ("mlp", ".block_sparse_moe."), ("lm_head", "lm_head."))


_SHAPES: dict[str, dict[str, torch.Size]] = {}  # by repr(cfg): a MoE decoder of ~18k Linears takes seconds to build


def shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Every parameter of the decoder ``cfg`` builds (a tied lm_head once, as the embedding), built on the meta device
    once per config: each family's own projections, biases and norms, nothing allocated."""
    key = repr(cfg)
    if key not in _SHAPES:
        with torch.device("meta"):
            _SHAPES[key] = {name: p.shape for name, p in Decoder(cfg).named_parameters()}
    return _SHAPES[key]


def expert_share(cfg: ModelConfig, batch: int = 1) -> float:
    """The share of a sparse layer's routed experts a decode step at ``batch`` reads: top_k / E for one token, the
    expected share of distinct experts (routing taken as uniform) for more; 1 for a dense model."""
    if cfg.moe is None:
        return 1.0
    return 1 - (1 - cfg.moe.top_k / cfg.moe.num_experts) ** batch


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part, their total and, for a mixture of experts, the active ones (those one token uses)."""
    kinds = ("embedding", "attention", "mlp", *(("experts",) if cfg.moe else ()), "norms", "lm_head")
    counts = dict.fromkeys(kinds, 0)
    for name, shape in shapes(cfg).items():
        counts[next(kind for kind, key in PARTS if key in name)] += shape.numel()
    counts["total"] = sum(counts.values())
    if cfg.moe:
        counts["active"] = counts["total"] - round(counts["experts"] * (1 - expert_share(cfg)))
    return counts


def weight_bytes(cfg: ModelConfig, fmt: Format, share: float = 1.0) -> float:
    """Bytes of the weights in ``fmt``; with ``share``, those a step reads that reads that share of the routed experts."""
    every = shapes(cfg)
    part = {name: share if ".experts." in name else 1.0 for name in every}  # the routed experts' share
    matrices = {name: s for name, s in every.items() if name.startswith("model.layers.") and len(s) == 2}
    linear = sum(s.numel() * part[name] for name, s in matrices.items())
    rows = sum(s[0] * part[name] for name, s in matrices.items())
    if fmt.group_size is None:
        meta = rows * 2 if fmt.weight_bits < 16 else 0  # one fp16 scale per output row
    else:
        meta = linear / fmt.group_size * (2 + fmt.weight_bits / 8)  # fp16 scale + packed zero point
    rest = sum(s.numel() * part[name] for name, s in every.items()) - linear
    return linear * fmt.weight_bits / 8 + meta + rest * 2  # the rest (embeddings, norms, biases) fp16


def kv_bytes_per_token(cfg: ModelConfig, dtype_bytes: int = 2) -> int:
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * dtype_bytes


@dataclass(frozen=True)
class DecodeStep:
    flops: float
    bytes: float
    intensity: float  # FLOP / byte
    ridge: float  # the GPU's FLOP / byte where compute and memory take equal time
    memory_bound: bool
    tokens_per_s: float  # upper bound


def decode_flops(cfg: ModelConfig, context: int) -> float:
    """FLOPs of one decoded token: 2 per matmul weight it uses (lm_head included; top-k of the routed experts) plus
    q.k and p.v over the context."""
    n = param_counts(cfg)
    matmul_params = n["attention"] + n["mlp"] + n.get("experts", 0) * expert_share(cfg) + cfg.vocab_size * cfg.hidden_size
    return 2 * matmul_params + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def tokens_per_s_bound(batch: int, nbytes: float, flops: float, tbps: float, tflops: float = float("inf")) -> float:
    """Tokens/s of a decode step at batch B that reads nbytes and does flops, at a bandwidth and a FLOP/s peak."""
    return batch / max(nbytes / (tbps * 1e12), flops / (tflops * 1e12))


def step_weight_bytes(cfg: ModelConfig, fmt: Format, batch: int) -> float:
    """Weight bytes a decode step at ``batch`` reads: every weight except the embedding table (one row per token is
    read), of a mixture of experts only the routed experts the batch chose (attention, router, shared expert and
    lm_head always)."""
    embedding = param_counts(cfg)["embedding"] * 2 if not cfg.tie_word_embeddings else 0
    return weight_bytes(cfg, fmt, expert_share(cfg, batch)) - embedding


def decode_step(cfg: ModelConfig, fmt: Format, gpu: GPU, batch: int, context: int) -> DecodeStep:
    flops = batch * decode_flops(cfg, context)
    nbytes = step_weight_bytes(cfg, fmt, batch) + batch * context * kv_bytes_per_token(cfg)
    intensity, ridge = flops / nbytes, gpu.tflops * 1e12 / (gpu.tbps * 1e12)
    bound = tokens_per_s_bound(batch, nbytes, flops, gpu.tbps, gpu.tflops)
    return DecodeStep(flops, nbytes, intensity, ridge, intensity < ridge, bound)
