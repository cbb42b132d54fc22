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
