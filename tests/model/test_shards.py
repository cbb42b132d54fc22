"""ShardWriter writes safetensors shards that safetensors and transformers read back."""

import json

import torch
from safetensors.torch import load_file

from compress.model.checkpoint import INDEX, Checkpoint
from compress.model.shards import ShardWriter


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "b.weight_packed": torch.randint(-2**31, 2**31 - 1, (16, 4), generator=g, dtype=torch.int32),
        "c.weight": torch.randn(3, generator=g, dtype=torch.float16),
        "d.weight_shape": torch.tensor([7, 9]),
        "e.weight": torch.randn(50, 50, generator=g),
    }


def test_one_shard_is_model_safetensors(tmp_path):
    w = ShardWriter(tmp_path)
    w.add(tensors())
    assert [p.name for p in w.close()] == ["model.safetensors"]
    assert not (tmp_path / INDEX).exists()
    back = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors().items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no parts left behind


def test_shards_split_at_max_bytes_with_an_index(tmp_path):
    w = ShardWriter(tmp_path, max_bytes=5000)
    for k, v in tensors().items():
        w.add({k: v})
    files = w.close()
    assert [f.name for f in files] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]  # e (10 kB) alone
    index = json.loads((tmp_path / INDEX).read_text())
    want = tensors()
    assert set(index["weight_map"]) == set(want)
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in want.values())
    for k, v in want.items():
        assert torch.equal(load_file(tmp_path / index["weight_map"][k])[k], v)
    ckpt = Checkpoint(tmp_path)
    assert all(torch.equal(ckpt.get(k), v) for k, v in want.items())
    for f in files:
        assert (8 + int.from_bytes(f.read_bytes()[:8], "little")) % 8 == 0  # data 8-byte aligned
