"""The int8-activation kernels' layout of codes (``nibble_q8_cpu``'s nibbles, ``byte_q8_cpu``'s bytes): rows in tiles
of 4, each tile's 32-byte blocks (64 inputs' nibbles, 32 inputs' bytes) interleaved, so that the 4 rows a tile
computes side by side are one sequential stream. Imports only torch.

Why: held row-major, a decode step reads 4 rows 1 KB or more apart per 64 inputs, 4 short streams a thread that the
hardware prefetchers pick up late; software prefetching took the int4 kernel to ~20 GB/s on a host that reads 30-34
GB/s, and the same bytes interleaved (llama.cpp's CPU backend repacks its Q4_0/Q4_K alike) read at ~29 GB/s.

Layout of codes [O, B] (B bytes a row, a multiple of 32): rows 4t .. 4t + R - 1 (R = 4, or what is left for the
last tile) start at byte 4t B of the weight; block b of row 4t + j at 32 (b R + j) from there. The tensor keeps its
row-major shape.
"""

import torch

ROWS = 4  # rows of W a tile computes at one row of x (nibble_q8_cpu's decode tile)
BLOCK = 32  # bytes: 64 inputs' nibbles


def _whole_and_rest(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    whole = codes.shape[0] - codes.shape[0] % ROWS
    return codes[:whole], codes[whole:]


def tiled(codes: torch.Tensor) -> torch.Tensor:
    """Row-major codes [O, B] (B a multiple of 32) -> the same bytes tiled, shape [O, B]."""
    out_features, half = codes.shape
    parts = [t.reshape(-1, len(t) if len(t) < ROWS else ROWS, half // BLOCK, BLOCK).transpose(1, 2).reshape(-1)
             for t in _whole_and_rest(codes) if len(t)]  # [tiles, R, blocks, 32] -> [tiles, blocks, R, 32]
    return torch.cat(parts).view(out_features, half) if parts else codes.clone()


def untiled(codes: torch.Tensor) -> torch.Tensor:
    """``tiled``'s inverse: row-major codes [O, B]."""
    out_features, half = codes.shape
    parts = [t.reshape(-1, half // BLOCK, len(t) if len(t) < ROWS else ROWS, BLOCK).transpose(1, 2).reshape(-1)
             for t in _whole_and_rest(codes) if len(t)]
    return torch.cat(parts).view(out_features, half) if parts else codes.clone()
