"""GgufTensors: a GGUF's tensors by our decoder's names, quantized rows read from the file at their offsets."""

import numpy as np
import torch

from compress.gguf.tensors import GgufTensors
from compress.gguf.metadata import gguf_config


def test_rows_read_from_the_file_are_the_maps_rows(q4_k_m_gguf):
    path, _ = q4_k_m_gguf
    src = GgufTensors(path, gguf_config(path))
    entry = src.entry("model.embed_tokens.weight")  # 49,152 rows: read in chunks
    mapped = torch.from_numpy(np.array(entry.data))  # [O, bytes] through gguf's map
    assert torch.equal(src.rows(entry), mapped)
    assert torch.equal(src.rows(entry, 1000, 7), mapped[1000:1007])
    assert torch.equal(src.rows(entry, mapped.shape[0] - 3, 10), mapped[-3:])  # clipped at the end


def test_a_tied_output_is_the_embedding_and_q_rows_come_back_in_transformers_order(q4_k_m_gguf):
    path, _ = q4_k_m_gguf
    src = GgufTensors(path, gguf_config(path))
    assert src.entry("lm_head.weight").name == "output.weight"
    del src.tensors["output.weight"]  # as in a file with tied embeddings
    assert src.entry("lm_head.weight").name == "token_embd.weight"
    assert src.heads("model.layers.0.self_attn.q_proj.weight") == src.cfg.num_heads
    assert src.heads("model.layers.0.self_attn.v_proj.weight") is None
    emb = src.get("model.embed_tokens.weight", (src.cfg.vocab_size, src.cfg.hidden_size))
    assert emb.dtype == torch.float32 and emb.shape == (49152, 320) and emb.abs().max() > 0
