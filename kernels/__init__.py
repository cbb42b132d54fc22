"""Compute kernels, installed as ``compress.kernels``.

Each op runs a Triton kernel on CUDA where one exists and the plain-torch reference
(``reference.py``) everywhere else, so the CPU runtime runs the same code path end to end.
"""

from compress.kernels.reference import dequant_matmul, dequantize_packed

__all__ = ["dequant_matmul", "dequantize_packed"]
