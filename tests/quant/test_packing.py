import pytest
import torch

from compress.kernels.reference import unpack_rows
from compress.quant import packing


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 32), (4, 33), (2, 100), (7, 576)])
def test_pack_unpack_identity(bits, shape):
    codes = torch.randint(0, 2**bits, shape)
    packed = packing.pack(codes, bits)
    assert packed.dtype == torch.int32
    assert packed.shape == (shape[0], packing.packed_width(shape[1], bits))
    assert torch.equal(packing.unpack(packed, bits, shape[1]).long(), codes)
    assert torch.equal(unpack_rows(packed, bits, shape[1]).long(), codes)  # the kernels' reference reads it too


def test_layout_int4_is_eight_nibbles_low_first():
    codes = torch.arange(8)[None]  # code j in bits [4j, 4j+4)
    assert packing.pack(codes, 4).item() == 0x76543210


def test_layout_int3_straddles_words():
    codes = torch.zeros(1, 32, dtype=torch.long)
    codes[0, 10] = 0b111  # bits 30..32: two bits in word 0, one in word 1
    words = packing.pack(codes, 3)[0]
    assert words.shape == (3,)
    assert words[0].item() == -(2**31) + 2**30  # bits 30 and 31 set (as int32)
    assert words[1].item() == 1 and words[2].item() == 0


def test_zero_points_pack_along_output_dim():
    z = torch.randint(0, 16, (20, 3))
    packed = packing.pack_zero_points(z, 4)
    assert packed.shape == (3, 3)  # ceil(20 * 4 / 32) rows
    assert torch.equal(packing.unpack_zero_points(packed, 4, 20).long(), z)


@pytest.mark.parametrize("bits", [3, 4])
def test_matches_compressed_tensors(bits):
    helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")
    codes = torch.randint(0, 2**bits, (6, 70))
    signed = (codes - 2 ** (bits - 1)).to(torch.int8)
    assert torch.equal(packing.pack(codes, bits), helpers.pack_to_int32(signed, bits))
    assert torch.equal(packing.pack_zero_points(codes, bits), helpers.pack_to_int32(signed, bits, packed_dim=0))


@pytest.mark.parametrize("rows, cols", [(1, 8), (5, 64), (7, 13), (3, 100), (2, 1)])
def test_four_bit_byte_path_equals_the_bit_stream(rows, cols):
    from compress.quant.packing import pack, pack_stream, unpack, unpack_stream

    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=torch.Generator().manual_seed(cols))
    packed = pack(codes, 4)
    assert torch.equal(packed, pack_stream(codes, 4))
    assert torch.equal(unpack(packed, 4, cols), unpack_stream(packed, 4, cols))
    assert torch.equal(unpack(packed, 4, cols), codes)
