"""Run the Triton kernels under the interpreter on CPU (TRITON_INTERPRET=1), compiled on CUDA.

Triton fixes interpret-or-compile when a kernel is decorated, i.e. when its module is imported,
and another test may have imported ``compress.kernels`` first; so the kernel modules are
reloaded here after the variable is set. On a CUDA machine the same tests run the compiled kernels.
The ``isa`` fixture runs a C kernel test once per x86 build of the CPU kernels.
"""

import importlib
import os

import pytest
import torch

KERNEL_MODULES = ["dequant_matmul", "int8_matmul", "fp8_matmul", "paged_attention", "fused_moe"]  # fused_moe after dequant_matmul: it reuses its tile

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
    for name in KERNEL_MODULES:
        importlib.reload(importlib.import_module(f"compress.kernels.{name}"))



@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


from compress.kernels import cpu_build  # noqa: E402 (after TRITON_INTERPRET is set: it imports the Triton kernels)

CPU_KERNELS = ["linear_cpu", "panel_cpu", "nibble_panel_cpu", "nibble_linear_cpu", "nibble_q8_cpu", "byte_q8_cpu", "int8_rows_cpu", "paged_attention_cpu", "rms_norm_cpu", "rope_cpu"]
# Both x86 code paths where the host has AVX-512: the native build (16-float vectors) and one with
# AVX-512 and AVX-VNNI switched off (COMPRESS_CPU_ISA=avx2: 8-float vectors, vpmaddubsw); elsewhere the native build only.
ISAS = ["native", "avx2"] if cpu_build.X86 else ["native"]


@pytest.fixture(params=ISAS)
def isa(request, monkeypatch) -> str:
    """The C kernels built as COMPRESS_CPU_ISA=<param> asks, their load() memos cleared before and after."""
    monkeypatch.setenv("COMPRESS_CPU_ISA", request.param)
    modules = [importlib.import_module(f"compress.kernels.{name}") for name in CPU_KERNELS]
    for m in modules:
        m.load.cache_clear()
    yield request.param
    for m in modules:
        m.load.cache_clear()
