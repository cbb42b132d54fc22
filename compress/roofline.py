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
    return {cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.intermediate_size}


# Where each parameter of the decoder counts, by a part of its name (first match): q/k norms are norms.
PARTS = (("embedding", "model.embed_tokens."), ("norms", "norm"), ("attention", ".self_attn."), ("mlp", ".mlp."),
         ("lm_head", "lm_head."))


def shapes(cfg: ModelConfig) -> dict[str, torch.Size]:
    """Every parameter of the decoder ``cfg`` builds (a tied lm_head once, as the embedding), built on the meta device:
    each family's own projections, biases and norms, nothing allocated."""
    with torch.device("meta"):
        model = Decoder(cfg)
    return {name: p.shape for name, p in model.named_parameters()}


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    counts = dict.fromkeys(("embedding", "attention", "mlp", "norms", "lm_head"), 0)
    for name, shape in shapes(cfg).items():
        counts[next(kind for kind, key in PARTS if key in name)] += shape.numel()
    counts["total"] = sum(counts.values())
    return counts


def weight_bytes(cfg: ModelConfig, fmt: Format) -> float:
    n = param_counts(cfg)
    matrices = [s for name, s in shapes(cfg).items() if name.startswith("model.layers.") and len(s) == 2]
    linear, rows = sum(s.numel() for s in matrices), sum(s[0] for s in matrices)
    if fmt.group_size is None:
        meta = rows * 2 if fmt.weight_bits < 16 else 0  # one fp16 scale per output row
    else:
        meta = linear / fmt.group_size * (2 + fmt.weight_bits / 8)  # fp16 scale + packed zero point
    return linear * fmt.weight_bits / 8 + meta + (n["total"] - linear) * 2  # the rest (embeddings, norms, biases) fp16


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
    """FLOPs of one decoded token: 2 per matmul weight (lm_head included) plus q.k and p.v over the context."""
    n = param_counts(cfg)
    matmul_params = n["attention"] + n["mlp"] + cfg.vocab_size * cfg.hidden_size
    return 2 * matmul_params + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context


def tokens_per_s_bound(batch: int, nbytes: float, flops: float, tbps: float, tflops: float = float("inf")) -> float:
    """Tokens/s of a decode step at batch B that reads nbytes and does flops, at a bandwidth and a FLOP/s peak."""
    return batch / max(nbytes / (tbps * 1e12), flops / (tflops * 1e12))


def decode_step(cfg: ModelConfig, fmt: Format, gpu: GPU, batch: int, context: int) -> DecodeStep:
    n = param_counts(cfg)
    flops = batch * decode_flops(cfg, context)
    # every weight except the embedding table (one row per token is read) + every KV cache
    read = weight_bytes(cfg, fmt) - (n["embedding"] * 2 if not cfg.tie_word_embeddings else 0)
    nbytes = read + batch * context * kv_bytes_per_token(cfg)
    intensity, ridge = flops / nbytes, gpu.tflops * 1e12 / (gpu.tbps * 1e12)
    bound = tokens_per_s_bound(batch, nbytes, flops, gpu.tbps, gpu.tflops)
    return DecodeStep(flops, nbytes, intensity, ridge, intensity < ridge, bound)
