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

from compress.errors import UserError
from compress.model import lazy, load
from compress.model.checkpoint import Checkpoint
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.quant import packing
from compress.quant.ignore import every_linear, leave_unquantized
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec
from compress.quant.swap import layer_linears, quantized_linears, swap_linears

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


def awq_block_state(block: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One quantized block's tensors in AutoAWQ's names: qweight/qzeros/scales per Linear, the rest as is."""
    linears = layer_linears(block)  # as the family stores them: Phi-3's qkv_proj is one WQLinear
    state = {k: v for k, v in block.state_dict().items() if k.rpartition(".")[0] not in linears}
    for name, m in linears.items():
        state.update(awq_tensors(name, m))
    return state


def awq_reader(ckpt: Checkpoint) -> lazy.Reader:
    """Reads a PackedLinear's tensors from AutoAWQ's qweight/qzeros/scales (exact: same codes), others as stored."""
    plain = lazy.plain_reader(ckpt)

    def read(name: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        if not isinstance(module, PackedLinear):
            return plain(name, module)
        codes = unpack_awq(ckpt.get(f"{name}.qweight")).t()  # [O, I]
        zeros = unpack_awq(ckpt.get(f"{name}.qzeros")).t()  # [O, G]
        out = {
            "weight_packed": packing.pack(codes, 4),
            "weight_zero_point": packing.pack_zero_points(zeros, 4),
            "weight_scale": ckpt.get(f"{name}.scales").t().contiguous(),
            "weight_shape": torch.tensor([module.out_features, module.in_features]),
        }
        if module.bias is not None:
            out["bias"] = ckpt.get(f"{name}.bias")
        return out

    return read


def open_awq(model_dir: Path) -> Decoder:
    """An AutoAWQ gemm checkpoint as a lazy Decoder with PackedLinear modules (lazy.py); a Linear the file stores
    as a plain ``weight`` (``modules_to_not_convert``, our --ignore) stays a Linear."""
    raw = load.read_config(model_dir)
    qc = raw["quantization_config"]
    spec = IntSpec(qc["bits"], qc["group_size"], symmetric=False)
    model = lazy.skeleton(ModelConfig.from_hf(raw))
    ckpt = Checkpoint(model_dir)
    leave_unquantized(model, {n for n in every_linear(model) if f"{n}.qweight" not in ckpt and f"{n}.weight" in ckpt})
    with torch.device("meta"):
        for block in model.model.layers:
            swap_linears(block, lambda _, lin: PackedLinear(lin.in_features, lin.out_features, spec, lin.bias is not None, torch.float16))
    missing = [n for n in quantized_linears(model) if f"{n}.qweight" not in ckpt]
    if missing:
        raise UserError(f"{model_dir} is not a complete AutoAWQ gemm checkpoint: {missing[0]}.qweight is missing")
    return lazy.attach(model, ckpt, awq_reader(ckpt))
