"""AutoAWQ "gemm" checkpoints (4-bit): write them, and read them back into our modules.

Per Linear with O outputs, I inputs, group g (AutoAWQ's WQLinear_GEMM):
* ``qweight`` int32 [I, O/8]: row i packs the codes of outputs 8k..8k+7 of input i, nibble j
  holding output 8k + AWQ_ORDER[j];
* ``qzeros`` int32 [I/g, O/8]: zero points, packed the same way;
* ``scales`` fp16 [I/g, O]; dequantization is (q - z) * s, codes and zeros unsigned 0..15.
config.json: quantization_config {"quant_method": "awq", "version": "gemm", "bits": 4, ...}.
"""

from pathlib import Path

import torch

from compress.model import load
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.quant import packing
from compress.quant.apply import quantized_linears, swap_linears
from compress.quant.export import cast_state
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SHIFTS = torch.arange(8) * 4


def pack_awq(codes: torch.Tensor) -> torch.Tensor:
    """[R, C] 4-bit codes -> [R, C/8] int32 in AutoAWQ's interleaved nibble order."""
    rows, cols = codes.shape
    v = codes.to(torch.int64).view(rows, cols // 8, 8)[..., list(AWQ_ORDER)]
    return packing.to_int32((v << SHIFTS).sum(-1))


def unpack_awq(words: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_awq`: [R, W] int32 -> [R, 8W] codes."""
    nibbles = ((words.to(torch.int64)[..., None] & 0xFFFFFFFF) >> SHIFTS) & 0xF  # [R, W, 8] in packed order
    codes = torch.empty_like(nibbles)
    codes[..., list(AWQ_ORDER)] = nibbles
    return codes.flatten(1)


def awq_tensors(name: str, m: PackedLinear) -> dict[str, torch.Tensor]:
    codes = packing.unpack(m.weight_packed, 4, m.in_features)  # [O, I]
    zeros = packing.unpack_zero_points(m.weight_zero_point, 4, m.out_features)  # [O, G]
    out = {
        f"{name}.qweight": pack_awq(codes.t().contiguous()),
        f"{name}.qzeros": pack_awq(zeros.t().contiguous()),
        f"{name}.scales": m.weight_scale.t().contiguous().half(),
    }
    if m.bias is not None:
        out[f"{name}.bias"] = m.bias.detach().half()
    return out


def write_awq(model: Decoder, spec: IntSpec, out_dir: Path, source_dir: Path) -> None:
    linears = quantized_linears(model)
    state = {k: v for k, v in load.state_for_saving(model).items() if k.rpartition(".")[0] not in linears}
    for name, m in linears.items():
        state.update(awq_tensors(name, m))
    state = {k: v.half() if v.is_floating_point() else v for k, v in state.items()}
    qc = {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": spec.group_size,
          "zero_point": True, "modules_to_not_convert": None}
    cfg = model.cfg.to_hf() | {"torch_dtype": "float16", "quantization_config": qc}
    load.write_checkpoint(out_dir, state, cfg, source_dir)


def load_awq(model_dir: Path, dtype: torch.dtype = torch.float32) -> Decoder:
    """An AutoAWQ gemm checkpoint -> Decoder with PackedLinear modules (exact: same codes)."""
    raw = load.read_config(model_dir)
    qc = raw["quantization_config"]
    spec = IntSpec(qc["bits"], qc["group_size"], symmetric=False)
    model = load.build(ModelConfig.from_hf(raw), dtype)
    state = load.read_state_dict(model_dir)
    for block in model.model.layers:
        swap_linears(block, lambda _, lin: PackedLinear(lin.in_features, lin.out_features, spec, lin.bias is not None, dtype))
    for name, m in quantized_linears(model).items():
        codes = unpack_awq(state.pop(f"{name}.qweight")).t()  # [O, I]
        zeros = unpack_awq(state.pop(f"{name}.qzeros")).t()  # [O, G]
        state[f"{name}.weight_packed"] = packing.pack(codes, 4)
        state[f"{name}.weight_zero_point"] = packing.pack_zero_points(zeros, 4)
        state[f"{name}.weight_scale"] = state.pop(f"{name}.scales").t()
        state[f"{name}.weight_shape"] = torch.tensor([m.out_features, m.in_features])
    return load.load_weights(model, cast_state(state, dtype)).eval()
