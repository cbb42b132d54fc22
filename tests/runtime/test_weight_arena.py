"""Held weights moved into one huge-page buffer: the same numbers, one storage, page-aligned, and nothing moved where
the host offers no huge pages."""

import pytest
import torch
from torch import nn

from compress.kernels import nibble_linear_cpu
from compress.runtime import weight_arena
from compress.runtime.cpu_modules import NibbleLinear, Scratch


def held_model(rows: int = 1024, inputs: int = 1024) -> nn.Sequential:
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(4):  # 4 x (512 KiB of codes + 2 x 128 KiB of scales and offsets): more than one 2 MiB page
        codes = torch.randint(0, 16, (rows, inputs), dtype=torch.uint8, generator=gen)
        scale, zero = torch.rand(rows, inputs // 32, generator=gen) + 0.5, torch.full((rows, inputs // 32), 8, dtype=torch.int32)
        packed = dict(zip(NibbleLinear.NAMES, nibble_linear_cpu.pack(codes, scale, zero)))
        layers.append(NibbleLinear(packed, None, Scratch()))
    return nn.Sequential(*layers)


def held_tensors(model: nn.Module) -> list[torch.Tensor]:
    return [t for m in model for t in m.packed]


@pytest.mark.skipif(not weight_arena.offered() or nibble_linear_cpu.load() is None, reason="no transparent huge pages or C compiler here")
def test_held_weights_move_into_one_aligned_buffer_unchanged():
    model = held_model()
    before = [t.clone() for t in held_tensors(model)]
    x = torch.randn(3, 1024)
    y = model(x)
    moved = weight_arena.gather(model)
    after = held_tensors(model)
    assert moved == sum(-(-t.nbytes // 64) * 64 for t in before) > weight_arena.PAGE
    assert len({t.untyped_storage().data_ptr() for t in after}) == 1  # one buffer
    assert after[0].data_ptr() % weight_arena.PAGE == 0 and all(t.data_ptr() % 64 == 0 for t in after)
    assert all(torch.equal(a, b) for a, b in zip(after, before))
    assert torch.equal(model(x), y)
    assert dict(model[0].named_buffers())["codes"].data_ptr() == after[0].data_ptr()  # the registered buffer moved


def test_nothing_moves_where_huge_pages_are_off_or_the_weights_are_small(tmp_path, monkeypatch):
    off = tmp_path / "enabled"
    off.write_text("always madvise [never]\n")
    monkeypatch.setattr(weight_arena, "THP", off)
    model = held_model()
    first = model[0].codes
    assert not weight_arena.offered() and weight_arena.gather(model) == 0 and model[0].codes is first
    monkeypatch.undo()
    small = held_model(rows=64, inputs=256)
    assert weight_arena.gather(small) == 0
