"""The modules the CPU path runs a Linear as (swapped in by ``cpu_linears``): ``CpuLinear`` over an fp32 weight,
``HeldLinear`` s over a compressed one (``NibbleLinear``, ``FiveLinear``, ``SixLinear``, ``ByteLinear``, ``Int8Linear``), each calling, per its row
count, the C kernel, the panel GEMM or torch's GEMM over a dequantized ``Scratch`` (cpu_linears.py says what each
holds in memory).
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from compress.kernels import (byte_q8_cpu, int8_rows_cpu, linear_cpu, nibble_five, nibble_forms, nibble_linear_cpu, nibble_panel_cpu,
                              nibble_q8_cpu, nibble_six, panel_cpu, row_tiles)


def frozen_bias(bias: torch.Tensor | None) -> nn.Parameter | None:
    return None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)


def use_at(table: list[bool], rows: int) -> bool:
    return table[rows] if rows < len(table) else table[-1]


class CpuLinear(nn.Module):
    """An fp32 Linear that runs the C GEMM, the panel GEMM or torch's per its row count (``use_c[rows]``,
    ``use_panel[rows]``), over one weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) and weight.is_contiguous() else \
            nn.Parameter(weight.detach().contiguous(), requires_grad=False)
        self.bias = frozen_bias(bias)
        self.use_c = [False]  # set from the Plan of its shape
        self.use_panel = [False]
        self.fuse_c = [False]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if use_at(self.use_c, rows):
            return linear_cpu.unchecked(x, self.weight, self.bias)
        if use_at(self.use_panel, rows):
            return panel_cpu.unchecked(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class Scratch:
    """One fp32 buffer that NibbleLinears' torch path dequantizes into, grown to the largest weight asked."""

    def __init__(self):
        self.buffer = torch.empty(0)

    def take(self, numel: int) -> torch.Tensor:
        if self.buffer.numel() < numel:
            self.buffer = torch.empty(numel)
        return self.buffer


class HeldLinear(nn.Module):
    """A Linear whose weight is held compressed (``packed``): per its row count the C ``kernel`` over it
    (``use_c[rows]``), the ``panel`` GEMM dequantizing into its panels (``use_panel[rows]``), or ``dequantize``
    into the shared Scratch and torch's GEMM."""

    # Subclasses name the kernel module's functions as properties, looked up at each call (tests replace them):
    # kernel and panel (x, packed, bias) -> y, dequantize (packed, out buffer) -> weight [O, I] fp32.

    def __init__(self, packed: dict[str, torch.Tensor], out_features: int, in_features: int, bias: torch.Tensor | None,
                 scratch: Scratch, tiled: tuple[str, ...] = ()):
        """packed: the kernel's tensors in its order, by the buffer names they are held under, codes first and
        row-major; ``tiled``: the names of those held tiled for the C kernel (``row_tiles``)."""
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.names = list(packed)
        self.tiled = tiled
        packed = {name: row_tiles.tiled(t) if name in tiled else t for name, t in packed.items()}
        for name, t in packed.items():
            self.register_buffer(name, t)
        self.bias = frozen_bias(bias)
        self.scratch = scratch
        self.use_c = [True]
        self.use_panel = [False]
        self.fuse_c = [True]

    @property
    def packed(self) -> tuple:
        return tuple(getattr(self, name) for name in self.names)

    @property
    def form(self) -> str:
        """How the scales are held (``nibble_forms.form``): fp32 but in a compact NibbleLinear."""
        return "fp32"

    def untiled(self, packed: tuple) -> tuple:
        """packed (this Linear's tensors, or the first rows of each) row-major: what the panel and dequantize
        functions take."""
        return tuple(row_tiles.untiled(t) if name in self.tiled else t for name, t in zip(self.names, packed))

    def row_major(self) -> dict[str, torch.Tensor]:
        """The held tensors by name, codes row-major: what joins concatenate."""
        return dict(zip(self.names, self.untiled(self.packed)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if use_at(self.use_c, rows):
            return self.kernel(x, self.packed, self.bias)
        if use_at(self.use_panel, rows):
            return self.panel(x, self.untiled(self.packed), self.bias)
        weight = self.dequantize(self.untiled(self.packed), self.scratch.take(self.out_features * self.in_features))  # [O, I]
        return F.linear(x, weight, self.bias)


class NibbleLinear(HeldLinear):
    """An int4/int3 PackedLinear held as nibbles (``nibble_linear_cpu.pack``); with ``int8_activations`` its C
    path rounds x to int8 per block of 32 and takes integer dot products (``nibble_q8_cpu``), and its scales and
    offsets are held in fp16 (or none) where that is exact (``nibble_forms.compact``; the other paths widen them
    per call) and its codes tiled for that kernel (``row_tiles``; the other paths untile them per call)."""

    NAMES = ("codes", "scales", "offsets")  # [O, I/2] uint8, [O, G] fp32 or fp16, [O, G] fp32 or fp16 or [O, 0]

    def __init__(self, packed: dict[str, torch.Tensor], bias: torch.Tensor | None, scratch: Scratch, int8_activations: bool = False):
        """packed: ``nibble_linear_cpu.pack``'s tensors by NAMES (several weights' rows may be joined, cpu_fusion.py)."""
        if int8_activations:
            packed = dict(zip(self.NAMES, nibble_forms.compact(tuple(packed[name] for name in self.NAMES))))
        super().__init__(packed, packed["codes"].shape[0], 2 * packed["codes"].shape[1], bias, scratch,
                         tiled=("codes",) if int8_activations else ())
        self.int8_activations = int8_activations

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias: torch.Tensor | None, scratch: Scratch,
                   int8_activations: bool = False) -> "NibbleLinear":
        """codes uint8 [O, I], scale and zero [O, G]: a PackedLinear's ``codes()``."""
        return cls(dict(zip(cls.NAMES, nibble_linear_cpu.pack(codes, scale, zero))), bias, scratch, int8_activations)

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[1]

    @property
    def form(self) -> str:
        return nibble_forms.form(self.packed)

    @property
    def kernel(self) -> Callable:
        return nibble_q8_cpu.unchecked if self.int8_activations else nibble_linear_cpu.unchecked

    @property
    def panel(self) -> Callable:
        return lambda x, packed, bias=None: nibble_panel_cpu.unchecked(x, self.wide(packed), bias)

    @property
    def panel_ready(self) -> bool:
        return nibble_panel_cpu.load() is not None

    @property
    def dequantize(self) -> Callable:
        return lambda packed, out=None: nibble_linear_cpu.dequantize(self.wide(packed), out)

    @staticmethod
    def wide(packed: tuple) -> tuple:
        """Row-major packed as ``nibble_linear_cpu.pack`` gives it: fp32 scales and offsets."""
        return nibble_forms.expanded(packed)


class GgufHeldLinear(HeldLinear):
    """A GGUF's wider block types, int8 activations per block of 32 (llama.cpp's arithmetic), C kernel or torch."""

    int8_activations = True

    @property
    def group_size(self) -> int:
        return self.in_features // self.scales.shape[1]

    @property
    def panel(self) -> Callable:
        raise NotImplementedError(f"{type(self).__name__} has no panel path")

    @property
    def panel_ready(self) -> bool:
        return False


class ByteLinear(GgufHeldLinear):
    """Signed 8-bit codes with an fp32 scale per group (``byte_q8_cpu``): a GGUF's Q6_K and Q8_0 Linears (and Q5_0
    where ``FiveLinear`` cannot hold it)."""

    NAMES = ("codes", "scales")  # [O, I] int8, [O, G] fp32

    def __init__(self, packed: dict[str, torch.Tensor], bias: torch.Tensor | None, scratch: Scratch):
        """packed: row-major codes and their scales by NAMES (the codes held tiled)."""
        super().__init__(packed, *packed["codes"].shape, bias, scratch, tiled=("codes",))

    @property
    def kernel(self) -> Callable:
        return byte_q8_cpu.unchecked

    @property
    def dequantize(self) -> Callable:
        return byte_q8_cpu.dequantize


class FiveLinear(GgufHeldLinear):
    """A GGUF's Q5_0 Linear in its own 5.5 bits a weight (``nibble_five``), run by ``nibble_q8_cpu``."""

    NAMES = ("codes", "scales", "high")  # [O, I/2] uint8, [O, I/32] fp16, [O, I/8] uint8

    def __init__(self, packed: dict[str, torch.Tensor], bias: torch.Tensor | None, scratch: Scratch):
        """packed: ``nibble_five.pack``'s tensors by NAMES, row-major (the codes held tiled)."""
        super().__init__(packed, packed["codes"].shape[0], 2 * packed["codes"].shape[1], bias, scratch, tiled=("codes",))

    @property
    def form(self) -> str:
        return nibble_forms.FIVE

    @property
    def kernel(self) -> Callable:
        return nibble_q8_cpu.unchecked

    @property
    def dequantize(self) -> Callable:
        return nibble_five.dequantize

    def as_bytes(self) -> ByteLinear:
        """The same weight a byte a code (to join a wider type's Linear, cpu_fusion)."""
        packed = {"codes": nibble_five.signed_codes(tuple(self.row_major().values())), "scales": self.scales.float()}
        return ByteLinear(packed, self.bias, self.scratch)


class SixLinear(GgufHeldLinear):
    """A GGUF's Q6_K Linear in its own 6.625 bits a weight (``nibble_six``), run by ``nibble_q8_cpu``."""

    NAMES = ("codes", "scales", "high")  # [O, I/2] uint8, [O, I/256, 20] uint8, [O, I/4] uint8 (2-bit crumbs)

    def __init__(self, packed: dict[str, torch.Tensor], bias: torch.Tensor | None, scratch: Scratch):
        """packed: ``nibble_six.pack``'s tensors by NAMES, row-major (the codes and their top bits held tiled)."""
        super().__init__(packed, packed["codes"].shape[0], 2 * packed["codes"].shape[1], bias, scratch, tiled=("codes", "high"))

    @property
    def group_size(self) -> int:
        return nibble_six.GROUP

    @property
    def form(self) -> str:
        return nibble_forms.SIX

    @property
    def kernel(self) -> Callable:
        return nibble_q8_cpu.unchecked

    @property
    def dequantize(self) -> Callable:
        return nibble_six.dequantize


class Int8Linear(HeldLinear):
    """A Linear held as int8 per output row (``int8_rows_cpu``): the lm_head where the user asks for it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, scratch: Scratch):
        packed = dict(zip(("codes", "scales"), int8_rows_cpu.quantize(weight.detach())))  # [O, I] int8, [O] fp32
        super().__init__(packed, *weight.shape, bias, scratch)

    @property
    def kernel(self) -> Callable:
        return int8_rows_cpu.unchecked

    @property
    def panel(self) -> Callable:
        return int8_rows_cpu.panel

    @property
    def panel_ready(self) -> bool:
        return True  # built with the kernel itself

    @property
    def dequantize(self) -> Callable:
        return int8_rows_cpu.dequantize
