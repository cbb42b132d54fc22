"""Write and read quantized checkpoints: compressed-tensors pack-quantized (int4/int3) and
float-quantized (fp8), our own int8-with-outliers format, and a GGUF's codes as read back (docs/formats.md).

The state dict of a quantized Decoder already carries the tensor names of its format
(``*.weight_packed``, ``*.weight_scale``, ``*.weight``, ``*.outlier_idx``, ...), so writing is
saving it next to a config.json whose ``quantization_config`` describes the scheme.
"""

from collections.abc import Sequence
from pathlib import Path

import torch

from compress.errors import UserError
from compress.model import lazy, load
from compress.model.arch import Arch
from compress.model.checkpoint import Checkpoint
from compress.model.config import ModelConfig
from compress.model.shards import ShardWriter
from compress.model.decoder import Decoder
from compress.quant.fp8 import Fp8Spec
from compress.quant.ignore import awq_skips, leave_unquantized, left_out, matched
from compress.quant.int8 import Int8Spec
from compress.quant.linear import Fp8Linear, GgufLinear, GgufSpec, Int8OutlierLinear, PackedLinear
from compress.quant.primitives import IntSpec
from compress.quant.swap import Spec, swap_linears

PACKED, FLOAT = "pack-quantized", "float-quantized"
INT8_METHOD = "compress-int8-outlier"
GGUF_METHOD = "compress-gguf-codes"


def int_args(spec: IntSpec) -> dict:
    return {"num_bits": spec.bits, "type": "int", "symmetric": spec.symmetric, "strategy": "group",
            "group_size": spec.group_size, "dynamic": False, "actorder": None, "observer": "minmax", "observer_kwargs": {}}


def fp8_args(strategy: str, dynamic: bool) -> dict:
    return {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "group_size": None,
            "dynamic": dynamic, "actorder": None, "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def compressed_tensors_config(fmt: str, weights: dict, inputs: dict | None, ignore: list[str]) -> dict:
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs,
                        "output_activations": None, "format": fmt}
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def int8_config(spec: Int8Spec, arch: Arch, ignore: list[str]) -> dict:
    return {
        "quant_method": INT8_METHOD,
        "version": 1,
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "dynamic": True}
        | ({"strategy": "group", "group_size": spec.act_group} if spec.act_group else {"strategy": "token"}),
        "outliers": {"threshold": spec.outlier_threshold, "topk": spec.outlier_topk, "dtype": "float16"},
        "smoothing": {"alpha": spec.smooth_alpha, "folded_into": ", ".join(smoothed_norms(arch) if spec.smooth_alpha else [])},
        "ignore": ignore,
    }


def smoothed_norms(arch: Arch) -> list[str]:
    """The norms SmoothQuant's scales fold into (static_apply.smooth_block): those that feed a scale group."""
    return [g.prev for g in arch.scale_groups if g.prev in arch.norms.names()]


def unquantized(cfg: ModelConfig, ignored: Sequence[str] = ()) -> list[str]:
    """The Linears quantization leaves as they are: lm_head, each MoE layer's router (and shared-expert gate), and the
    user's ``ignored`` (--ignore), by full name as llm-compressor writes them: a router is in a scale group (it takes
    the folded scale) but not a Linear of the layer."""
    routers = [f"model.layers.{i}.{name}" for i in range(cfg.num_layers)
               for name in dict.fromkeys(n for g in cfg.layer_groups(i) for n in g.linears) if name not in cfg.layer_linears(i)]
    return ["lm_head", *routers, *ignored]


def quantization_config(spec: Spec, cfg: ModelConfig, ignored: Sequence[str] = ()) -> dict:
    ignore = unquantized(cfg, ignored)
    if isinstance(spec, GgufSpec):
        return {"quant_method": GGUF_METHOD, "types": spec.types}
    if isinstance(spec, Int8Spec):
        return int8_config(spec, cfg.arch, ignore)
    if isinstance(spec, Fp8Spec):
        inputs = fp8_args("tensor", False) if spec.static_activations else fp8_args("token", True)
        return compressed_tensors_config(FLOAT, fp8_args("channel", False), inputs, ignore)
    return compressed_tensors_config(PACKED, int_args(spec), None, ignore)


def spec_from_config(qc: dict) -> Spec:
    if qc.get("quant_method") == GGUF_METHOD:
        return GgufSpec(qc["types"])
    if qc.get("quant_method") == INT8_METHOD:
        act = qc.get("input_activations", {})
        return Int8Spec(qc["outliers"]["threshold"], qc["outliers"]["topk"], qc.get("smoothing", {}).get("alpha", 0.0),
                        act.get("group_size", 0) if act.get("strategy") == "group" else 0)
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


class QuantizedWriter:
    """Writes a quantized model as its blocks are finished (``block``), then the rest (``finish``):
    sharded safetensors in ``fmt`` ("compressed-tensors" or AutoAWQ's "awq"), floats stored as ``dtype``."""

    def __init__(self, out_dir: Path, model: Decoder, spec: Spec, fmt: str, dtype: torch.dtype, source_dir: Path | None):
        self.out_dir, self.model, self.spec, self.fmt, self.source_dir = Path(out_dir), model, spec, fmt, source_dir
        self.dtype = torch.float16 if fmt == "awq" else dtype  # AutoAWQ's gemm format is fp16
        self.writer = ShardWriter(out_dir)
        self.stats = {"linears": 0, "outlier_dims": 0}  # what the blocks written so far hold
        self.ignored: list[str] = []  # full names of the Linears left unquantized (--ignore), as the blocks are written

    def block(self, i: int, block: torch.nn.Module) -> None:
        from compress.quant.awq_format import awq_block_state

        for m in block.modules():
            if isinstance(m, Int8OutlierLinear):
                self.stats["linears"] += 1
                self.stats["outlier_dims"] += m.outlier_idx.numel()
        self.ignored += left_out(self.model, i, block)
        prefix = f"model.layers.{i}."
        state = awq_block_state(block) if self.fmt == "awq" else block.state_dict()
        self.writer.add(lazy.cast({prefix + k: v for k, v in state.items()}, self.dtype))

    def finish(self) -> None:
        """Embeddings, final norm and an untied lm_head (read from the checkpoint if not in memory), config.json."""
        for part in lazy.top_parts(self.model):
            if part.startswith("model.layers."):
                continue
            module = self.model.get_submodule(part)
            state = self.model.reader(part, module) if lazy.is_lazy(module) else module.state_dict()
            self.writer.add(lazy.cast({f"{part}.{k}": v for k, v in state.items()}, self.dtype))
        cfg = self.model.cfg.to_hf() | {"torch_dtype": load.dtype_name(self.dtype), "quantization_config": self.quantization_config()}
        load.finish_checkpoint(self.out_dir, self.writer, cfg, self.source_dir)

    def quantization_config(self) -> dict:
        if self.fmt == "awq":
            return {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": self.spec.group_size,
                    "zero_point": True, "modules_to_not_convert": awq_skips(unquantized(self.model.cfg, self.ignored))}
        return quantization_config(self.spec, self.model.cfg, self.ignored)


def write_quantized(model: Decoder, spec: Spec, out_dir: Path, source_dir: Path | None, fmt: str = "compressed-tensors",
                    dtype: torch.dtype | None = None) -> None:
    """Write a quantized model held in memory (floats as ``dtype``, default the embeddings')."""
    writer = QuantizedWriter(out_dir, model, spec, fmt, dtype or model.model.embed_tokens.weight.dtype, source_dir)
    for i, block in enumerate(model.model.layers):
        writer.block(i, block)
    writer.finish()


def empty_module(spec: Spec, lin: torch.nn.Linear, name: str, ckpt: Checkpoint) -> torch.nn.Module:
    """The quantized module for ``spec`` on the meta device, shaped for ``name``'s tensors in ``ckpt``."""
    bias = lin.bias is not None
    with torch.device("meta"):
        if isinstance(spec, GgufSpec):
            return GgufLinear(lin.in_features, lin.out_features, spec.types[name], bias)
        if isinstance(spec, Int8Spec):
            return Int8OutlierLinear(lin.in_features, lin.out_features, ckpt.shape(f"{name}.outlier_idx")[0], bias, torch.float32,
                                     spec.act_group)
        if isinstance(spec, Fp8Spec):
            return Fp8Linear(lin.in_features, lin.out_features, spec.static_activations, bias, torch.float32)
        return PackedLinear(lin.in_features, lin.out_features, spec, bias, torch.float32)


def open_quantized(model_dir: Path) -> Decoder:
    """One of our compressed-tensors or int8-outlier exports as a lazy Decoder with quantized modules (lazy.py)."""
    raw = load.read_config(model_dir)
    spec = spec_from_config(raw["quantization_config"])
    ckpt = Checkpoint(model_dir)
    model = lazy.skeleton(ModelConfig.from_hf(raw))
    leave_unquantized(model, matched(model, raw["quantization_config"].get("ignore", [])))
    for i, block in enumerate(model.model.layers):
        swap_linears(block, lambda name, lin: empty_module(spec, lin, f"model.layers.{i}.{name}", ckpt))
    if isinstance(spec, GgufSpec) and "lm_head" in spec.types:  # a GGUF's output layer read keeping its codes
        model.lm_head = empty_module(spec, model.lm_head, "lm_head", ckpt)
    model = lazy.attach(model, ckpt)
    load.check_names(model, ckpt)
    return model
