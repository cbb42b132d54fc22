"""Which type each tensor gets: llama.cpp's choices for its file types (llama_tensor_get_type, no imatrix)."""

from collections import Counter

import pytest

from compress.gguf.types import FILE_TYPES, fallback, tensor_type, use_more_bits

ROLES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def smollm2_types(ft: str) -> Counter:
    """SmolLM2-135M's 2-D tensors (30 layers, hidden 576, MLP 1536, tied embedding)."""
    rows = {"ffn_down": 1536}
    kinds = [tensor_type(FILE_TYPES[ft], r, rows.get(r, 576), i, 30, tied=True) for i in range(30) for r in ROLES]
    return Counter(kinds + [tensor_type(FILE_TYPES[ft], "token_embd", 576, tied=True)])


def test_smollm2_q4_k_m_is_what_llama_cpp_wrote():
    # llama.cpp's llama_model_quantize of the same F32 file gave these counts (and the same 105,454,368 bytes).
    assert smollm2_types("Q4_K_M") == {"Q5_0": 166, "Q4_K": 16, "Q8_0": 15, "Q6_K": 14}


def test_q4_0_keeps_the_tied_output_at_q8_0_where_q6_k_does_not_fit():
    assert smollm2_types("Q4_0") == {"Q4_0": 210, "Q8_0": 1}
    assert tensor_type(FILE_TYPES["Q4_0"], "token_embd", 4096, tied=True) == "Q6_K"
    assert tensor_type(FILE_TYPES["Q4_0"], "token_embd", 4096, tied=False) == "Q4_0"
    assert tensor_type(FILE_TYPES["Q4_0"], "output", 4096) == "Q6_K"


def test_q4_k_m_widens_attn_v_and_ffn_down_of_the_layers_llama_cpp_picks():
    picked = [i for i in range(32) if use_more_bits(i, 32)]
    assert picked == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    ft = FILE_TYPES["Q4_K_M"]
    assert [tensor_type(ft, "attn_v", 4096, i, 32) for i in (0, 4, 6)] == ["Q6_K", "Q4_K", "Q6_K"]
    assert tensor_type(ft, "ffn_down", 14336, 4, 32) == "Q4_K"
    assert tensor_type(ft, "attn_q", 4096, 0, 32) == "Q4_K"


@pytest.mark.parametrize("kind,row,expected", [("Q4_K", 576, "Q5_0"), ("Q6_K", 576, "Q8_0"), ("Q4_K", 512, "Q4_K"),
                                               ("Q4_0", 48, "F16"), ("Q6_K", 48, "F16")])
def test_fallback_when_blocks_do_not_divide_a_row(kind, row, expected):
    assert fallback(kind, row) == expected


def test_q8_0_and_unquantized_files():
    assert tensor_type(FILE_TYPES["Q8_0"], "output", 4096) == "Q8_0"
    assert tensor_type(FILE_TYPES["Q8_0"], "ffn_down", 14336, 0, 32) == "Q8_0"
    assert tensor_type(FILE_TYPES["F16"], "output", 4096) == "F16"
