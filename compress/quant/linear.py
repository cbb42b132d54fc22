"""Quantized Linear modules. Buffers are named as compressed-tensors names them on disk (GgufLinear's are ours)."""

from dataclasses import dataclass

import torch
from torch import nn

from compress import kernels
from compress.quant import fp8, gguf_blocks, int8, packing
from compress.quant.gguf_blocks import TYPES
from compress.quant.primitives import IntSpec, qparams, quantize


class PackedLinear(nn.Module):
    """Group-quantized int4/int3 weights in the pack-quantized layout (see packing.py).

    weight_packed int32 [O, ceil(I*b/32)], weight_scale [O, I/g], weight_zero_point int32
    [ceil(O*b/32), I/g] (absent when symmetric), weight_shape int64 [2] = (O, I).
    """

    def __init__(self, in_features: int, out_features: int, spec: IntSpec, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features, self.spec = in_features, out_features, spec
        groups = in_features // spec.group_size
        self.register_buffer("weight_packed", torch.zeros(out_features, packing.packed_width(in_features, spec.bits), dtype=torch.int32))
        self.register_buffer("weight_scale", torch.zeros(out_features, groups, dtype=dtype))
        zp = None if spec.symmetric else torch.zeros(packing.packed_width(out_features, spec.bits), groups, dtype=torch.int32)
        self.register_buffer("weight_zero_point", zp)
        self.register_buffer("weight_shape", torch.tensor([out_features, in_features]))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None

    @classmethod
    def from_float(cls, linear: nn.Linear, spec: IntSpec, params: tuple[torch.Tensor, torch.Tensor] | None = None,
                   codes: torch.Tensor | None = None) -> "PackedLinear":
        """Round ``linear`` to ``spec`` with (scale, zero) [O, G] from ``params`` (a search) or each group's range;
        ``codes`` uint8 [O, I] on that grid replace nearest rounding (GPTQ's choice)."""
        w = linear.weight.detach()
        new = cls(linear.in_features, linear.out_features, spec, linear.bias is not None, w.dtype)
        scale, zero = params if params is not None else qparams(w, spec)
        new.weight_packed.copy_(packing.pack(codes if codes is not None else quantize(w, scale, zero, spec), spec.bits))
        new.weight_scale.copy_(scale)
        if not spec.symmetric:
            new.weight_zero_point.copy_(packing.pack_zero_points(zero, spec.bits))
        if linear.bias is not None:
            new.bias.data.copy_(linear.bias.detach())
        return new.to(w.device)

    def codes(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes uint8 [O, I], scale [O, G], zero int32 [O, G]): the weight is (codes - zero) * scale per group."""
        q = packing.unpack(self.weight_packed, self.spec.bits, self.in_features)
        if self.spec.symmetric:
            zero = torch.full_like(self.weight_scale, 2 ** (self.spec.bits - 1), dtype=torch.int32)
        else:
            zero = packing.unpack_zero_points(self.weight_zero_point, self.spec.bits, self.out_features).to(torch.int32)
        return q, self.weight_scale, zero

    def dequantized(self) -> torch.Tensor:
        return kernels.dequantize_packed(self.weight_packed, self.weight_scale, self.weight_zero_point, self.spec.bits, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.dequant_matmul(x, self.weight_packed, self.weight_scale, self.weight_zero_point, self.spec.bits, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bits={self.spec.bits}, group={self.spec.group_size}"


class Int8OutlierLinear(nn.Module):
    """LLM.int8 with calibrated outlier dims (see compress/quant/int8.py and docs/formats.md).

    weight int8 [O, I] (outlier columns zero), weight_scale [O, 1], outlier_idx int32 [k],
    outlier_weight fp16 [O, k]. act_group: x's int8 steps per token and block of that many inputs (0: per token).
    """

    def __init__(self, in_features: int, out_features: int, num_outliers: int, bias: bool, dtype: torch.dtype, act_group: int = 0):
        super().__init__()
        self.in_features, self.out_features, self.act_group = in_features, out_features, act_group
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8))
        self.register_buffer("weight_scale", torch.zeros(out_features, 1, dtype=dtype))
        self.register_buffer("outlier_idx", torch.zeros(num_outliers, dtype=torch.int32))
        self.register_buffer("outlier_weight", torch.zeros(out_features, num_outliers, dtype=torch.float16))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None

    @classmethod
    def from_float(cls, linear: nn.Linear, outlier_idx: torch.Tensor, act_group: int = 0) -> "Int8OutlierLinear":
        w = linear.weight.detach()
        new = cls(linear.in_features, linear.out_features, outlier_idx.numel(), linear.bias is not None, w.dtype, act_group)
        q, scale, outliers = int8.split_weight(w, outlier_idx.to(w.device))
        new.weight.copy_(q)
        new.weight_scale.copy_(scale)
        new.outlier_idx.copy_(outlier_idx)
        new.outlier_weight.copy_(outliers)
        if linear.bias is not None:
            new.bias.data.copy_(linear.bias.detach())
        return new.to(w.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.int8_outlier_matmul(x, self.weight, self.weight_scale, self.outlier_idx, self.outlier_weight, self.bias,
                                           self.act_group)

    def extra_repr(self) -> str:
        steps = f", x steps per {self.act_group} inputs" if self.act_group else ""
        return f"in={self.in_features}, out={self.out_features}, outliers={self.outlier_idx.numel()}{steps}"


class Fp8Linear(nn.Module):
    """fp8 e4m3 weights per output channel, activations per token (or one static input_scale).

    weight float8_e4m3fn [O, I], weight_scale [O, 1], input_scale [1] (static activations only).
    """

    def __init__(self, in_features: int, out_features: int, static: bool, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn))
        self.register_buffer("weight_scale", torch.zeros(out_features, 1, dtype=dtype))
        self.register_buffer("input_scale", torch.ones(1, dtype=dtype) if static else None)
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None

    @classmethod
    def from_float(cls, linear: nn.Linear, input_scale: torch.Tensor | None = None) -> "Fp8Linear":
        w = linear.weight.detach()
        new = cls(linear.in_features, linear.out_features, input_scale is not None, linear.bias is not None, w.dtype)
        q, scale = fp8.quantize_weight(w)
        new.weight.copy_(q)
        new.weight_scale.copy_(scale)
        if input_scale is not None:
            new.input_scale.copy_(input_scale)
        if linear.bias is not None:
            new.bias.data.copy_(linear.bias.detach())
        return new.to(w.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.fp8_matmul(x, self.weight, self.weight_scale, self.bias, self.input_scale)

    def extra_repr(self) -> str:
        kind = "static" if self.input_scale is not None else "dynamic per-token"
        return f"in={self.in_features}, out={self.out_features}, e4m3, activations {kind}"


@dataclass(frozen=True)
class GgufSpec:
    """A GGUF file read keeping its codes (compress.gguf.reader): each decoder Linear's ggml block type by full name
    (and "lm_head"'s where an untied output layer kept its codes)."""

    types: dict[str, str]

    def __post_init__(self):
        unknown = sorted(set(self.types.values()) - set(TYPES))
        if unknown:
            raise ValueError(f"GGUF types {unknown} are not kept as codes (kept: {', '.join(TYPES)})")


ROWS = 4096  # a GGUF tensor's rows unpacked at a time


class GgufLinear(nn.Module):
    """One ggml block type's numbers as ggml holds them, unpacked: w = s * codes (+ offset) per group.

    weight_codes [O, I]: int8 q - 2^(bits-1) for the symmetric types (Q4_0, Q5_0, Q8_0, Q6_K), uint8 q for Q4_1 and
    Q4_K; weight_scale [O, I/group] fp32 of either sign; weight_offset [O, I/group] fp32 (Q4_1, Q4_K only).
    """

    def __init__(self, in_features: int, out_features: int, kind: str, bias: bool):
        super().__init__()
        t = TYPES[kind]
        self.in_features, self.out_features, self.kind = in_features, out_features, kind
        groups = in_features // t.group
        self.register_buffer("weight_codes", torch.zeros(out_features, in_features, dtype=torch.int8 if t.symmetric else torch.uint8))
        self.register_buffer("weight_scale", torch.zeros(out_features, groups))
        self.register_buffer("weight_offset", None if t.symmetric else torch.zeros(out_features, groups))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @classmethod
    def from_ggml(cls, kind: str, raw: torch.Tensor, bias: torch.Tensor | None) -> "GgufLinear":
        """From one tensor's ggml bytes raw [O, I/block*type_size] (rows as the module computes them)."""
        t = TYPES[kind]
        in_features = raw.shape[1] // t.type_size * t.block
        new = cls(in_features, raw.shape[0], kind, bias is not None)
        for at in range(0, raw.shape[0], ROWS):  # an 8B output layer unpacked at once took GBs of temporaries
            codes, scale, offset = gguf_blocks.native(t, raw[at:at + ROWS], in_features)
            new.weight_codes[at:at + ROWS] = codes
            new.weight_scale[at:at + ROWS] = scale
            if offset is not None:
                new.weight_offset[at:at + ROWS] = offset
        if bias is not None:
            new.bias.data.copy_(bias.detach())
        return new

    @property
    def bits(self) -> int:
        return TYPES[self.kind].bits

    def dequantized(self, rows: slice = slice(None)) -> torch.Tensor:
        """[O, I] fp32 (or those ``rows``)."""
        codes, scale = self.weight_codes[rows], self.weight_scale[rows]
        w = codes.float().view(codes.shape[0], scale.shape[1], -1) * scale.unsqueeze(-1)  # [o, G, g]
        if self.weight_offset is not None:
            w = w + self.weight_offset[rows].unsqueeze(-1)
        return w.view(codes.shape[0], self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ROWS output rows at a time: a 152k x 4096 output layer dequantized whole took 2.5 GB a call
        out = x.new_empty(*x.shape[:-1], self.out_features)  # [..., O]
        for at in range(0, self.out_features, ROWS):
            rows = slice(at, at + ROWS)
            bias = None if self.bias is None else self.bias[rows].to(x.dtype)
            out[..., rows] = nn.functional.linear(x, self.dequantized(rows).to(x.dtype), bias)
        return out

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, {self.kind}"
