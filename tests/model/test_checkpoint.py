"""Checkpoint reads a sharded safetensors checkpoint tensor by tensor, and refuses broken ones in one line."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.errors import UserError
from compress.model.checkpoint import INDEX, Checkpoint
from tests.conftest import save_hf, tiny_hf


@pytest.fixture
def sharded(tmp_path):
    model = tiny_hf("llama").to(torch.bfloat16)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    return tmp_path


def test_reads_every_tensor_of_a_sharded_checkpoint_as_stored(sharded):
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 2 and (sharded / INDEX).is_file()
    expected = {k: v for f in shards for k, v in load_file(f).items()}
    ckpt = Checkpoint(sharded)
    assert sorted(ckpt.keys()) == sorted(expected)
    assert ckpt.dtype() == torch.bfloat16
    for name, want in expected.items():
        got = ckpt.get(name)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)
        assert ckpt.shape(name) == tuple(want.shape)
    name = next(iter(expected))
    assert torch.equal(ckpt.get(name, torch.float32), expected[name].float())


def test_a_tensor_read_in_several_reads_when_the_system_returns_part(sharded, monkeypatch):
    """Linux returns at most ~2 GiB per read: a larger tensor (a 152k x 4096 fp32 table) takes several."""
    import os

    from compress.model import checkpoint

    real, calls = os.preadv, []

    def short(fd, buffers, offset):
        calls.append(offset)
        return real(fd, [buffers[0][:1000]], offset)  # as the system does past its limit

    monkeypatch.setattr(checkpoint.os, "preadv", short)
    expected = {k: v for f in sorted(sharded.glob("model-*.safetensors")) for k, v in load_file(f).items()}
    name = max(expected, key=lambda k: expected[k].numel())
    assert torch.equal(Checkpoint(sharded).get(name), expected[name]) and len(calls) > 1


def test_dtype_is_that_of_most_bytes(tmp_path):
    save_file({"a": torch.zeros(100, dtype=torch.float16), "b": torch.zeros(10), "i": torch.zeros(1000, dtype=torch.int32)},
              str(tmp_path / "model.safetensors"))
    assert Checkpoint(tmp_path).dtype() == torch.float16


def test_truncated_file_is_one_line(tmp_path):
    save_hf(tiny_hf("llama"), tmp_path)
    f = tmp_path / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(UserError, match="truncated"):
        Checkpoint(tmp_path)


def test_corrupt_header_is_one_line(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(UserError, match="corrupt safetensors header"):
        Checkpoint(tmp_path)


def test_index_naming_a_missing_shard(sharded):
    victim = sorted(sharded.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(UserError, match=f"missing, e.g. {victim.name}"):
        Checkpoint(sharded)


def test_malformed_index(sharded):
    (sharded / INDEX).write_text(json.dumps({"metadata": {}}))
    with pytest.raises(UserError, match="not a valid safetensors index"):
        Checkpoint(sharded)


def test_pickle_only_directory_is_refused(tmp_path):
    torch.save({"w": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match="pickle weights"):
        Checkpoint(tmp_path)
