"""Run the Triton kernels under the interpreter on CPU (TRITON_INTERPRET=1), compiled on CUDA.

Triton fixes interpret-or-compile when a kernel is decorated, i.e. when its module is imported,
and another test may have imported ``compress.kernels`` first; so the kernel modules are
reloaded here after the variable is set. On a CUDA machine the same tests run the compiled kernels.
"""

import importlib
import os

import pytest
import torch

KERNEL_MODULES = ["dequant_matmul", "int8_matmul", "fp8_matmul", "paged_attention"]

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    for name in KERNEL_MODULES:
        importlib.reload(importlib.import_module(f"compress.kernels.{name}"))



@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
