"""The GGUF file types we write and which type each tensor gets, as llama.cpp's quantizer assigns them.

A file type (llama.cpp's "ftype": Q4_K_M, Q4_0, ...) is a base type for the Linears plus rules that keep some
tensors wider (llama_tensor_get_type in src/llama-quant.cpp, without an importance matrix, dense models):
- the output layer, and the token embedding when it is tied to it: Q6_K (Q8_0 where the row length is not
  a multiple of the base type's block, and for Q8_0 files);
- Q4_K_M: attn_v and ffn_down of the layers ``use_more_bits`` picks (the first and last eighth, every third
  between): Q6_K;
- a K-quant whose 256-weight blocks do not divide a row falls back (Q4_K -> Q5_0, Q6_K -> Q8_0);
- 1-D tensors (norms, biases) stay F32.
"""

from dataclasses import dataclass

BLOCK = {"F32": 1, "F16": 1, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q8_0": 32, "Q4_K": 256, "Q6_K": 256}
FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


@dataclass(frozen=True)
class FileType:
    name: str  # as llama.cpp's quantize tool spells it
    ftype: int  # general.file_type (enum llama_ftype)
    base: str  # the type of the Linears the rules leave alone
    bits: int  # the width a method rounds to: 4, 8, or 16/32 for unquantized files

    @property
    def quantized(self) -> bool:
        return self.bits <= 8


FILE_TYPES = {
    "Q4_0": FileType("Q4_0", 2, "Q4_0", 4),
    "Q4_1": FileType("Q4_1", 3, "Q4_1", 4),
    "Q4_K_M": FileType("Q4_K_M", 15, "Q4_K", 4),
    "Q8_0": FileType("Q8_0", 7, "Q8_0", 8),
    "F16": FileType("F16", 1, "F16", 16),
    "F32": FileType("F32", 0, "F32", 32),
}
DEFAULT_4BIT, DEFAULT_8BIT = "Q4_K_M", "Q8_0"


def use_more_bits(layer: int, layers: int) -> bool:
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def fallback(kind: str, row: int) -> str:
    """``kind``, or the type llama.cpp uses instead when its blocks do not divide a row of ``row`` weights."""
    if row % BLOCK[kind] == 0:
        return kind
    kind = FALLBACK.get(kind, "F16")
    return kind if row % BLOCK[kind] == 0 else "F16"


def tensor_type(ft: FileType, role: str, row: int, layer: int = 0, layers: int = 1, tied: bool = False) -> str:
    """The type of a 2-D weight with rows of ``row`` weights; ``role`` is its GGUF name without "blk.N." and
    ".weight" (token_embd, output, attn_v, ffn_down, ...)."""
    if not ft.quantized:
        return ft.base
    kind = ft.base
    if role == "output" or (role == "token_embd" and tied):
        kind = "Q8_0" if row % BLOCK[kind] or kind == "Q8_0" else "Q6_K"
    elif ft.name == "Q4_K_M" and role in ("attn_v", "ffn_down") and use_more_bits(layer, layers):
        kind = "Q6_K"
    return fallback(kind, row)
