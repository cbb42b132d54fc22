"""Input checks shared by the kernel wrappers. Imports only torch and triton.

A wrapper raises ``ValueError`` naming the argument and what it expected; nothing is
silently cast or moved between devices.
"""

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: kernels then run on CPU tensors through numpy."""
    return bool(triton.knobs.runtime.interpret)


def check_device(**tensors: torch.Tensor | None) -> None:
    """All tensors on one device, and that device CUDA unless the interpreter runs."""
    given = {name: t for name, t in tensors.items() if t is not None}
    devices = {t.device for t in given.values()}
    if len(devices) > 1:
        raise ValueError("tensors must share one device, got " + ", ".join(f"{n}={t.device}" for n, t in given.items()))
    device = devices.pop()
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"Triton kernels need CUDA tensors (or TRITON_INTERPRET=1), got {device}")


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"{name} must be {' or '.join(map(str, allowed))}, got {t.dtype}")


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")


def check_bias(bias: torch.Tensor | None, out_features: int, dtype: torch.dtype) -> None:
    if bias is not None:
        check_shape("bias", bias, (out_features,))
        check_dtype("bias", bias, (dtype,))


def dot_operands(dtype: torch.dtype) -> dict:
    """Kernel constexprs DOT_DTYPE and PRECISION for ``tl.dot`` on operands of ``dtype``.

    fp32 operands multiply in full precision (not TF32), so that results match the reference.
    The interpreter's bf16 ``tl.dot`` returns garbage (triton 3.9), so there bf16 operands are
    upcast to fp32 first; exact, as bf16 products are exact in fp32.
    """
    if dtype == torch.float32 or (dtype == torch.bfloat16 and interpreting()):
        return {"DOT_DTYPE": tl.float32, "PRECISION": "ieee"}
    return {"DOT_DTYPE": tl.float16 if dtype == torch.float16 else tl.bfloat16, "PRECISION": "tf32"}


def check_paged_attention(q, k_cache, v_cache, block_tables, context_lens) -> None:
    """The paged-attention contract of docs/kernels.md (shapes, dtypes), for every device's kernel."""
    check_dtype("q", q, FLOAT_DTYPES)
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [seqs, heads, head_dim] and k_cache [blocks, block_size, kv_heads, head_dim], "
                         f"got {list(q.shape)} and {list(k_cache.shape)}")
    seqs, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != dim or heads % kv_heads:
        raise ValueError(f"k_cache {list(k_cache.shape)} does not fit q {list(q.shape)}: head_dim must match and "
                         f"heads must be a multiple of kv_heads")
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    check_dtype("k_cache", k_cache, (q.dtype,))
    check_dtype("v_cache", v_cache, (q.dtype,))
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must be contiguous along head_dim")
    check_dtype("block_tables", block_tables, (torch.int32,))
    check_dtype("context_lens", context_lens, (torch.int32,))
    if block_tables.dim() != 2 or block_tables.shape[0] != seqs:
        raise ValueError(f"block_tables must be [{seqs}, max_blocks_per_seq], got {list(block_tables.shape)}")
    check_shape("context_lens", context_lens, (seqs,))


def check_attention_options(softcap: float | None, window: int | None) -> None:
    """Paged attention's soft-cap (None or > 0) and sliding window (None or a token count >= 1)."""
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be None or > 0, got {softcap}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
