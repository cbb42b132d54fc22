"""Autotune tile configurations shared by the int8 and fp8 scaled-matmul kernels."""

import triton

from compress.kernels.checks import interpreting


def scaled_matmul_configs(decode: bool) -> list[triton.Config]:
    """Tiles for M <= 16 (decode: one 16-row tile, narrow column tiles for more programs) or larger M."""
    if interpreting():
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32})]
    rows, cols = ((16,), (32, 64, 128)) if decode else ((64, 128), (64, 128))
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=4, num_stages=3)
            for bm in rows for bn in cols for bk in (64, 128)]
