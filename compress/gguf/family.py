"""Which of our families llama.cpp runs, under which GGUF architecture, and the metadata it reads.

llama.cpp's converter (convert_hf_to_gguf.py) is the reference for every key and tensor written here.
Mistral is llama's architecture to llama.cpp; llama's q/k rows are stored with each head's rotary pairs
interleaved (llama.cpp's "normal" rope), the Qwen and Gemma families keep transformers' half-split order
("neox"). Gemma's norms (q/k norms too) are stored as 1 + w (llama.cpp multiplies by the weight; transformers by
1 + w), soft-caps and the sliding window as keys. What llama.cpp assumes rather than reads (which layers slide,
the attention scale 1/sqrt(head_dim) or for the 27B shapes 1/sqrt(hidden/heads), Gemma 3's sliding layers' rope
base 10000) a checkpoint must match to be written.
"""

import math
from dataclasses import dataclass

import torch

from compress.errors import UserError
from compress.model.config import ModelConfig


CAPS = ("attn_logit_softcapping", "final_logit_softcapping")  # "{arch}.*" keys, named as in config.json


@dataclass(frozen=True)
class GgufFamily:
    arch: str  # general.architecture
    permute_qk: bool  # q/k rows reordered from transformers' half-split rotary layout to interleaved pairs
    swa_period: int = 0  # llama.cpp slides layers i with i % n < n - 1 (Gemma 2: 2, Gemma 3: 6); 0: no sliding window
    drop_windows: bool = False  # a window is dropped, llama.cpp attending to every token (Mistral, as its converter)
    norm_plus_one: bool = False  # norms stored as 1 + w
    wide_scale_layers: int = 0  # the layer count at which llama.cpp scales scores by 1/sqrt(hidden/heads) (Gemma's 27B)
    local_rope_theta: float | None = None  # the sliding layers' rope base llama.cpp assumes (Gemma 3), unscaled
    caps: tuple[str, ...] = ()  # soft-cap keys llama.cpp applies (defaulting them where a file lacks them); no others


FAMILIES = {
    "llama": GgufFamily("llama", True),
    "mistral": GgufFamily("llama", True, drop_windows=True),
    "qwen2": GgufFamily("qwen2", False),
    "qwen3": GgufFamily("qwen3", False),
    "gemma2": GgufFamily("gemma2", False, swa_period=2, norm_plus_one=True, wide_scale_layers=46, caps=CAPS),
    "gemma3_text": GgufFamily("gemma3", False, swa_period=6, norm_plus_one=True, wide_scale_layers=62, local_rope_theta=10000.0),
}
ROPE_TYPES = ("linear", "llama3", "yarn")  # scalings llama.cpp reads for these architectures


def family(cfg: ModelConfig) -> GgufFamily:
    """The GGUF family of ``cfg``, or one line saying why llama.cpp cannot run it from a file we write."""
    if cfg.model_type not in FAMILIES:
        raise UserError(f"--format gguf writes {', '.join(FAMILIES)} models; this is a {cfg.model_type} model "
                        "(use --format compressed-tensors for it)")
    if cfg.moe is not None:
        raise UserError("--format gguf does not write mixture-of-experts models yet; use --format compressed-tensors")
    rope = (cfg.rope_scaling or {}).get("rope_type")
    if rope is not None and rope not in ROPE_TYPES:
        raise UserError(f"--format gguf: llama.cpp's {cfg.model_type} reads no '{rope}' rope scaling; use --format compressed-tensors")
    fam = FAMILIES[cfg.model_type]
    windows, n = cfg.windows(), fam.swa_period
    allowed = windows if fam.drop_windows else [cfg.sliding_window if n and i % n < n - 1 else None for i in range(len(windows))]
    if cfg.partial_rotary_factor != 1.0 or windows != allowed:
        raise UserError(f"--format gguf: llama.cpp's {fam.arch} has no partial rotary, or these layers' sliding windows; "
                        "use --format compressed-tensors for this checkpoint")
    if abs(cfg.scale() - llama_cpp_scale(cfg, fam)) > 1e-6 * cfg.scale():
        raise UserError(f"--format gguf: llama.cpp's {fam.arch} scales attention by {llama_cpp_scale(cfg, fam):.6g} for this "
                        f"shape, this checkpoint by {cfg.scale():.6g} (query_pre_attn_scalar); use --format compressed-tensors")
    wrong = [k for k, v in soft_caps(cfg).items() if (v is None) == (k in fam.caps)]
    if wrong:
        raise UserError(f"--format gguf: llama.cpp's {fam.arch} applies the soft-caps {', '.join(fam.caps) or 'none'} "
                        f"(defaulting absent ones), this checkpoint {soft_caps(cfg)}; use --format compressed-tensors")
    local = cfg.local_rope
    if local is not None and (local.get("rope_type", "default") != "default" or local.get("rope_theta") != fam.local_rope_theta):
        raise UserError(f"--format gguf: llama.cpp's {fam.arch} rotates sliding layers with base {fam.local_rope_theta}, "
                        f"this checkpoint with {local}; use --format compressed-tensors")
    return fam


def soft_caps(cfg: ModelConfig) -> dict[str, float | None]:
    return {"attn_logit_softcapping": cfg.attn_softcap, "final_logit_softcapping": cfg.final_softcap}


def query_scalar(cfg: ModelConfig, fam: GgufFamily) -> int:
    """What llama.cpp divides scores by the square root of: head_dim, or n_embd / n_head (integers) for the 27B shapes."""
    return cfg.hidden_size // cfg.num_heads if cfg.num_layers == fam.wide_scale_layers else cfg.head_dim


def llama_cpp_scale(cfg: ModelConfig, fam: GgufFamily) -> float:
    return query_scalar(cfg, fam) ** -0.5


def hyperparameters(cfg: ModelConfig) -> dict[str, object]:
    """"{arch}.*" keys (without the prefix) as convert_hf_to_gguf.py writes them."""
    keys = {
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "feed_forward_length": cfg.intermediate_size,
        "block_count": cfg.num_layers,
        "attention.head_count": cfg.num_heads,
        "attention.head_count_kv": cfg.num_kv_heads,
        "attention.key_length": cfg.head_dim,
        "attention.value_length": cfg.head_dim,
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        "rope.freq_base": float(cfg.rope_theta),
        "rope.dimension_count": cfg.head_dim,
        "vocab_size": cfg.vocab_size,
    }
    keys |= {k: float(soft_caps(cfg)[k]) for k in FAMILIES[cfg.model_type].caps}
    if FAMILIES[cfg.model_type].swa_period:
        keys["attention.sliding_window"] = cfg.sliding_window
    rope = cfg.rope_scaling or {}
    if rope.get("rope_type") == "linear":
        keys |= {"rope.scaling.type": "linear", "rope.scaling.factor": float(rope["factor"])}
    if rope.get("rope_type") == "yarn":
        keys |= {"rope.scaling.type": "yarn", "rope.scaling.factor": float(rope["factor"]),
                 "rope.scaling.original_context_length": int(rope["original_max_position_embeddings"])}
    return keys


def rope_freqs(cfg: ModelConfig) -> torch.Tensor | None:
    """Llama 3's frequency-dependent rope scaling as llama.cpp reads it: a "rope_freqs.weight" tensor [D/2] of
    divisors of each pair's base frequency (convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors)."""
    rope = cfg.rope_scaling or {}
    if rope.get("rope_type") != "llama3":
        return None
    dim = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # [D/2]
    factor, low, high = rope["factor"], rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def permute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [heads * D, ...] from transformers' rotary layout (pairs (i, i + D/2)) to llama.cpp's (pairs (2i, 2i+1)).
    Any per-row data (a quantized row's bytes) moves with its row."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def unpermute_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``permute_rows``: llama.cpp's rotary row order back to transformers'."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_names(cfg: ModelConfig):
    """HF tensor name -> GGUF tensor name (gguf-py's own table, as llama.cpp's converter uses it)."""
    import gguf

    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == family(cfg).arch)
    table = gguf.get_tensor_name_map(arch, cfg.num_layers)
    return lambda name: table.get_name(name, try_suffixes=(".weight", ".bias"))


def role(gguf_name: str) -> str:
    """"blk.3.attn_v.weight" -> "attn_v"."""
    parts = gguf_name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]
