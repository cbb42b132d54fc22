"""Write and read quantized checkpoints: compressed-tensors pack-quantized (int4/int3) and
float-quantized (fp8), and our own int8-with-outliers format (docs/formats.md).

The state dict of a quantized Decoder already carries the tensor names of its format
(``*.weight_packed``, ``*.weight_scale``, ``*.weight``, ``*.outlier_idx``, ...), so writing is
saving it next to a config.json whose ``quantization_config`` describes the scheme.
"""

from pathlib import Path

import torch

from compress.errors import UserError
from compress.model import load
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.quant.apply import Spec, swap_linears
from compress.quant.fp8 import Fp8Spec
from compress.quant.int8 import Int8Spec
from compress.quant.linear import Fp8Linear, Int8OutlierLinear, PackedLinear
from compress.quant.primitives import IntSpec

PACKED, FLOAT = "pack-quantized", "float-quantized"
INT8_METHOD = "compress-int8-outlier"
KEEP_DTYPE = (".weight_packed", ".weight_zero_point", ".weight_shape", ".outlier_idx", ".outlier_weight")


def int_args(spec: IntSpec) -> dict:
    return {"num_bits": spec.bits, "type": "int", "symmetric": spec.symmetric, "strategy": "group",
            "group_size": spec.group_size, "dynamic": False, "actorder": None, "observer": "minmax", "observer_kwargs": {}}


def fp8_args(strategy: str, dynamic: bool) -> dict:
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "group_size": None,
            "dynamic": dynamic, "actorder": None, "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def compressed_tensors_config(fmt: str, weights: dict, inputs: dict | None) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs,
                        "output_activations": None, "format": fmt}
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def int8_config(spec: Int8Spec) -> dict:
    return {
        "quant_method": INT8_METHOD,
        "version": 1,
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
        "outliers": {"threshold": spec.outlier_threshold, "topk": spec.outlier_topk, "dtype": "float16"},
        "smoothing": {"alpha": spec.smooth_alpha, "folded_into": "input_layernorm, post_attention_layernorm"},
        "ignore": ["lm_head"],
    }


def quantization_config(spec: Spec) -> dict:
    if isinstance(spec, Int8Spec):
        return int8_config(spec)
    if isinstance(spec, Fp8Spec):
        inputs = fp8_args("tensor", False) if spec.static_activations else fp8_args("token", True)
        return compressed_tensors_config(FLOAT, fp8_args("channel", False), inputs)
    return compressed_tensors_config(PACKED, int_args(spec), None)


def spec_from_config(qc: dict) -> Spec:
    if qc.get("quant_method") == INT8_METHOD:
        return Int8Spec(qc["outliers"]["threshold"], qc["outliers"]["topk"], qc.get("smoothing", {}).get("alpha", 0.0))
    if qc.get("quant_method") != "compressed-tensors" or qc.get("format") not in (PACKED, FLOAT):
        raise UserError(
            f"unsupported quantization_config (quant_method={qc.get('quant_method')}, format={qc.get('format')}); "
            f"this version reads compressed-tensors {PACKED} / {FLOAT}, {INT8_METHOD} and AutoAWQ gemm checkpoints"
        )
    groups = list(qc["config_groups"].values())
    if len(groups) != 1:
        raise UserError(f"checkpoints with {len(groups)} quantization groups are not supported (one expected)")
    if qc["format"] == FLOAT:
        inputs = groups[0]["input_activations"] or {}
        return Fp8Spec(static_activations=inputs.get("dynamic") is False)
    w = groups[0]["weights"]
    return IntSpec(w["num_bits"], w["group_size"], w["symmetric"])


def write_quantized(model: Decoder, spec: Spec, out_dir: Path, source_dir: Path) -> None:
    dtype = model.model.embed_tokens.weight.dtype
    cfg = model.cfg.to_hf() | {"torch_dtype": str(dtype).removeprefix("torch."), "quantization_config": quantization_config(spec)}
    load.write_checkpoint(out_dir, load.state_for_saving(model), cfg, source_dir)


def empty_module(spec: Spec, lin: torch.nn.Linear, name: str, state: dict, dtype: torch.dtype) -> torch.nn.Module:
    """The quantized module for ``spec``, shaped to receive ``name``'s tensors from ``state``."""
    bias = lin.bias is not None
    if isinstance(spec, Int8Spec):
        return Int8OutlierLinear(lin.in_features, lin.out_features, state[f"{name}.outlier_idx"].numel(), bias, dtype)
    if isinstance(spec, Fp8Spec):
        return Fp8Linear(lin.in_features, lin.out_features, spec.static_activations, bias, dtype)
    return PackedLinear(lin.in_features, lin.out_features, spec, bias, dtype)


def cast_state(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Floating tensors to ``dtype``, except codes (fp8, int) and the fp16 outlier columns."""
    def keep(k: str, v: torch.Tensor) -> bool:
        return not v.is_floating_point() or v.dtype == torch.float8_e4m3fn or k.endswith(KEEP_DTYPE)

    return {k: v if keep(k, v) else v.to(dtype) for k, v in state.items()}


def load_quantized(model_dir: Path, dtype: torch.dtype = torch.float32) -> Decoder:
    """One of our compressed-tensors or int8-outlier exports -> Decoder with quantized modules."""
    raw = load.read_config(model_dir)
    spec = spec_from_config(raw["quantization_config"])
    cfg = ModelConfig.from_hf(raw)
    model = load.build(cfg, dtype)
    state = load.read_state_dict(model_dir)
    for i, block in enumerate(model.model.layers):
        swap_linears(block, lambda name, lin: empty_module(spec, lin, f"model.layers.{i}.{name}", state, dtype))
    return load.load_weights(model, cast_state(state, dtype)).eval()
