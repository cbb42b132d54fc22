"""Activation importance ranks planted dead neurons, heads, channels and layers last."""

import torch

from compress.prune.importance import activation_importance, magnitude_importance


def test_planted_dead_structures_rank_last(tmp_path):
    from tests.prune.conftest import tiny_teacher

    _, model = tiny_teacher(tmp_path, num_key_value_heads=4)  # MHA: a head's V rows are its own
    D = model.cfg.head_dim
    with torch.no_grad():
        blocks = model.model.layers
        blocks[0].mlp.up_proj.weight[5] = 0  # neuron 5 of layer 0 never fires
        blocks[1].self_attn.v_proj.weight[2 * D:3 * D] = 0  # head 2 of layer 1 outputs nothing
        blocks[1].self_attn.v_proj.bias = None
        for m in (blocks[2].self_attn.o_proj, blocks[2].mlp.down_proj):  # block 2 adds nothing to the stream
            m.weight.zero_()
        model.model.embed_tokens.weight[:, 7] = 0  # channel 7 carries nothing in or out
        for b in blocks:
            b.self_attn.o_proj.weight[7] = 0
            b.mlp.down_proj.weight[7] = 0
    imp = activation_importance(model, torch.randint(0, 256, (4, 16)), batch=2)
    assert imp.neurons[0].argmin() == 5 and imp.neurons[0, 5] == 0
    assert imp.heads[1].argmin() == 2 and imp.heads[1, 2] == 0
    assert imp.layers.argmin() == 2 and imp.layers[2] < 1e-6
    assert imp.channels.argmin() == 7
    assert imp.neurons.shape == (4, 128) and imp.heads.shape == (4, 4) and imp.channels.shape == (64,)


def test_magnitude_importance_shapes(teacher):
    _, model = teacher
    imp = magnitude_importance(model)
    assert imp.neurons.shape == (4, 128) and imp.heads.shape == (4, 4) and imp.layers.shape == (4,)
