"""`compress info`: print the numbers of compress.roofline for one model."""

from compress import models
from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.model.load import read_config
from compress.roofline import GPUS, decode_step, formats, kv_bytes_per_token, param_counts, step_weight_bytes, weight_bytes


def print_info(model: str, gpu: str, batch: int, context: int) -> None:
    if batch < 1 or context < 1:
        raise UserError(f"--batch and --context must be at least 1, got --batch {batch} --context {context}")
    raw = read_config(models.resolve(model))
    cfg = ModelConfig.from_hf(raw)
    g = GPUS[gpu]
    print(f"{model}: {cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_heads} heads / {cfg.num_kv_heads} KV heads, head_dim {cfg.head_dim}")
    print("\nparameters")
    for kind, n in param_counts(cfg).items():
        print(f"  {kind:<10} {n:>14,}")
    if cfg.moe is not None:
        print(f"  active: {cfg.moe.top_k} of {cfg.moe.num_experts} routed experts per token in {len(cfg.moe.layers)} sparse layers")
    kv = kv_bytes_per_token(cfg)
    print(f"\nKV cache (fp16): {kv:,} bytes/token, {kv * context / 2**20:.1f} MiB per sequence of {context} tokens")
    print(f"\ndecode step on {g.name} ({g.tflops} TFLOP/s, {g.tbps} TB/s), batch {batch}, context {context}")
    print(f"int4/int3 at group size {formats(cfg)[3].group_size}")
    if cfg.moe is not None:
        print(f"a step reads the routed experts its {batch} tokens choose (routing taken as uniform), every other weight once")
    print("| format | weights MiB (disk = GPU memory) | weights MiB read per step | FLOP/byte | ridge | bound | tokens/s bound |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for fmt in formats(cfg):
        s = decode_step(cfg, fmt, g, batch, context)
        bound = "memory" if s.memory_bound else "compute"
        print(f"| {fmt.name} | {weight_bytes(cfg, fmt) / 2**20:.1f} | {step_weight_bytes(cfg, fmt, batch) / 2**20:.1f} | "
              f"{s.intensity:.1f} | {s.ridge:.0f} | {bound} | {s.tokens_per_s:,.0f} |")
