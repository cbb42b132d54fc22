"""Write and read quantized checkpoints (compressed-tensors pack-quantized).

The state dict of a quantized Decoder already carries compressed-tensors' tensor names
(``*.weight_packed``, ``*.weight_scale``, ``*.weight_zero_point``, ``*.weight_shape``), so writing
is saving it next to a config.json whose ``quantization_config`` describes the scheme.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from compress.errors import UserError
from compress.model import load
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.quant.apply import swap_linears
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec

CT_FORMAT = "pack-quantized"


def quantization_config(spec: IntSpec) -> dict:
    weights = {
        "num_bits": spec.bits, "type": "int", "symmetric": spec.symmetric, "strategy": "group",
        "group_size": spec.group_size, "dynamic": False, "actorder": None, "observer": "minmax",
        "observer_kwargs": {},
    }
    return {
        "quant_method": "compressed-tensors",
        "format": CT_FORMAT,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                        "output_activations": None, "format": CT_FORMAT}
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def spec_from_config(qc: dict) -> IntSpec:
    if qc.get("quant_method") != "compressed-tensors" or qc.get("format") != CT_FORMAT:
        raise UserError(
            f"unsupported quantization_config (quant_method={qc.get('quant_method')}, format={qc.get('format')}); "
            f"this version reads compressed-tensors {CT_FORMAT} checkpoints"
        )
    groups = list(qc["config_groups"].values())
    if len(groups) != 1:
        raise UserError(f"checkpoints with {len(groups)} quantization groups are not supported (one expected)")
    w = groups[0]["weights"]
    return IntSpec(w["num_bits"], w["group_size"], w["symmetric"])


def write_quantized(model: Decoder, spec: IntSpec, out_dir: Path, source_dir: Path) -> None:
    out_dir = Path(out_dir)
    save_file(load.state_for_saving(model), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    dtype = model.model.embed_tokens.weight.dtype
    cfg = model.cfg.to_hf() | {"torch_dtype": str(dtype).removeprefix("torch."), "quantization_config": quantization_config(spec)}
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    load.copy_tokenizer(source_dir, out_dir)


def load_quantized(model_dir: Path, dtype: torch.dtype = torch.float32) -> Decoder:
    raw = load.read_config(model_dir)
    spec = spec_from_config(raw["quantization_config"])
    cfg = ModelConfig.from_hf({k: v for k, v in raw.items() if k != "quantization_config"})
    model = load.build(cfg, dtype)
    for block in model.model.layers:
        swap_linears(block, lambda _, lin: PackedLinear(lin.in_features, lin.out_features, spec, lin.bias is not None, dtype))
    state = load.read_state_dict(model_dir)
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return load.load_weights(model, state).eval()
