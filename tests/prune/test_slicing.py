"""Slicing: the identity at full size, a valid transformers model at any GQA-consistent shape."""

import torch

from compress.model.load import save_decoder
from compress.prune.importance import random_importance
from compress.prune.shape import Shape
from compress.prune.slicing import prune, select


def test_pruning_to_the_full_size_is_the_identity(teacher):
    _, model = teacher
    full = Shape.of(model.cfg)
    pruned = prune(model, select(random_importance(model, 0), full, full), full)
    ids = torch.randint(0, 256, (2, 12))
    assert torch.equal(pruned(ids), model(ids))


def test_pruned_model_loads_in_transformers_with_our_logits(teacher, tmp_path):
    from transformers import AutoModelForCausalLM

    _, model = teacher
    shape = Shape(hidden_size=48, intermediate_size=80, num_heads=2, num_kv_heads=1, num_layers=3)
    keep = select(random_importance(model, 1), Shape.of(model.cfg), shape)
    pruned = prune(model, keep, shape)
    (tmp_path / "pruned").mkdir()
    save_decoder(pruned, tmp_path / "pruned")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "pruned", dtype=torch.float32).eval()
    assert (hf.config.hidden_size, hf.config.num_hidden_layers, hf.config.num_key_value_heads) == (48, 3, 1)
    ids = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, pruned(ids), atol=1e-4)


def test_kept_heads_stay_in_their_kv_groups(teacher):
    _, model = teacher
    imp = random_importance(model, 2)
    keep = select(imp, Shape.of(model.cfg), Shape(64, 128, 2, 2, 4))  # one query head per group, both groups
    for heads, groups in zip(keep.heads, keep.kv_heads):
        assert groups == [0, 1] and [h // 2 for h in heads] == groups
    keep = select(imp, Shape.of(model.cfg), Shape(64, 128, 2, 1, 4))  # the better group, whole
    for layer, heads, groups in zip(keep.layers, keep.heads, keep.kv_heads):
        best = int(imp.heads[layer].view(2, 2).sum(1).argmax())
        assert groups == [best] and heads == [2 * best, 2 * best + 1]
