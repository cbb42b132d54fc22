"""The int8-activation kernel's tiled codes: each tile of 4 rows (fewer at the end) one stream of 32-byte blocks."""

import pytest
import torch

from compress.kernels.row_tiles import tiled, untiled


@pytest.mark.parametrize("out_features", [1, 3, 4, 8, 13])  # a lone short tile, whole tiles, whole tiles and a short one
def test_block_b_of_row_4t_plus_j_sits_where_the_kernel_reads_it(out_features):
    half = 96  # 192 inputs: 3 blocks of 64 a row
    codes = torch.randint(0, 256, (out_features, half), dtype=torch.uint8, generator=torch.Generator().manual_seed(out_features))
    flat = tiled(codes).reshape(-1)
    assert tiled(codes).shape == codes.shape
    for n in range(out_features):
        tile, j = divmod(n, 4)
        rows = min(4, out_features - 4 * tile)
        for b in range(3):
            at = 4 * tile * half + 32 * (b * rows + j)
            assert torch.equal(flat[at:at + 32], codes[n, 32 * b:32 * b + 32])
    assert torch.equal(untiled(tiled(codes)), codes)


def test_one_block_a_row_is_row_major_already():
    codes = torch.randint(0, 256, (7, 32), dtype=torch.uint8)
    assert torch.equal(tiled(codes), codes)
