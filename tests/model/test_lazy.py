"""A lazy Decoder: parts are read from the checkpoint when materialized and dropped when released."""

import torch

from compress.model import lazy
from compress.model.load import open_decoder
from tests.conftest import save_hf, tiny_hf


def test_parts_come_and_go(tmp_path):
    hf = tiny_hf("llama")
    model = open_decoder(save_hf(hf, tmp_path))
    assert all(lazy.is_lazy(b) for b in model.model.layers)
    block = lazy.materialize(model, "model.layers.1", torch.float32)
    assert not lazy.is_lazy(block) and lazy.is_lazy(model.model.layers[0])
    want = hf.model.layers[1].mlp.down_proj.weight
    assert torch.equal(block.mlp.down_proj.weight, want)
    lazy.release(model, "model.layers.1")
    assert lazy.is_lazy(block)


def test_materialize_all_matches_transformers(tmp_path):
    hf = tiny_hf("llama", tie_word_embeddings=True)
    model = lazy.materialize_all(open_decoder(save_hf(hf, tmp_path)), torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.randint(0, 256, (2, 10))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() < 1e-4


def test_untied_table_stays_as_stored_and_rows_widen_exactly(tmp_path):
    hf = tiny_hf("llama").to(torch.bfloat16)
    model = lazy.materialize_all(open_decoder(save_hf(hf, tmp_path)), torch.float32)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight.dtype == model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32
    wide = lazy.materialize_all(open_decoder(tmp_path), torch.float32)
    wide.model.embed_tokens.weight.data = wide.model.embed_tokens.weight.data.float()
    ids = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        assert torch.equal(model(ids), wide(ids))


def test_tied_table_follows_the_dtype(tmp_path):
    hf = tiny_hf("llama", tie_word_embeddings=True).to(torch.bfloat16)
    model = lazy.materialize_all(open_decoder(save_hf(hf, tmp_path)), torch.float32)
    assert model.model.embed_tokens.weight.dtype == torch.float32
