"""llama.cpp's own intermediate tensors on a GGUF file against our decoder computing the same file as ggml does,
layer by layer: where, and how early, the two parts.

llama.cpp's side comes from its eval callback (``llama_context_params.cb_eval``): every F32 tensor of one decode, by
ggml's names (``l_out-3`` is layer 3's output). Ours is the file read back (``models.load_model``: the file's exact
weights) with each Linear's input rounded to int8 as ggml rounds it for the Linear's type (``ggml_rounding``) and
attention as llama.cpp's default context computes it (``attend_f16``: F16 KV cache, queries and softmax weights
rounded to fp16). Where a layer's output differs by ~1e-7 the arithmetic is the same; a jump to ~1e-3 is an int8
code flipped by a last-bit difference upstream.

    python -m compress.bench.llamacpp_ops FILE.gguf --tokens 504,3575,282,4649,314
"""

import contextlib
import ctypes

import click
import numpy as np
import torch

from compress import models
from compress.bench.llamacpp import import_llama_cpp
from compress.kernels import reference
from compress.model import attention
from compress.quant.linear import GgufLinear


class GgmlTensor(ctypes.Structure):  # ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, GGML_MAX_SRC 10, names of 64)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def llamacpp_tensors(path: str, ids: list[int]) -> dict[str, np.ndarray]:
    """Every contiguous F32 tensor llama.cpp computes evaluating ``ids`` as one batch (flash attention off, as
    llama-cpp-python's default), by name; a name computed twice keeps its last value."""
    llama_cpp = import_llama_cpp()
    out = {}

    @llama_cpp.ggml_backend_sched_eval_callback
    def keep(pointer, ask, _):
        if ask:
            return True
        t = ctypes.cast(pointer, ctypes.POINTER(GgmlTensor)).contents
        shape = [t.ne[i] for i in range(3, -1, -1)]
        if t.type == 0 and t.data and t.nb[0] == 4 and t.nb[1] == 4 * t.ne[0]:  # GGML_TYPE_F32, rows contiguous
            data = ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float))
            out[t.name.decode()] = np.ctypeslib.as_array(data, shape=(int(np.prod(shape)),)).copy().reshape(shape)
        return True

    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = max(64, len(ids))
    params.n_threads = params.n_threads_batch = torch.get_num_threads()
    params.flash_attn_type = 0  # LLAMA_FLASH_ATTN_TYPE_DISABLED
    params.cb_eval, params.cb_eval_user_data = keep, None
    ctx = llama_cpp.llama_init_from_model(model, params)
    try:
        tokens = (llama_cpp.llama_token * len(ids))(*ids)
        if llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, len(ids))) != 0:
            raise RuntimeError(f"llama.cpp could not evaluate {len(ids)} tokens of {path}")
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)
    return out


def ggml_rounding(module: torch.nn.Module, args: tuple) -> tuple:
    """A forward pre-hook: the Linear's input x rounded as ggml rounds it for the Linear's GGUF type (Q8_K for the
    K-quants, one step per 256 inputs; else Q8_0, fp16 steps per 32; Q4_1's fp16 block sums are not emulated)."""
    x = args[0]
    if getattr(module, "kind", "") in ("Q4_K", "Q6_K") and x.shape[-1] % 256 == 0:
        return (reference.round_blocks_int8(x, 256, "reciprocal"),)
    return (reference.round_blocks_int8(x, 32, "fp16"),)


def attend_f16(q, k, v, mask, causal, scale, softcap):
    """attention.attend as llama.cpp computes it without flash attention: K and V from an F16 cache, the queries and
    the softmax weights rounded to fp16 for their products, sums in fp32 (no soft-cap: families that use one are
    not compared here)."""
    if softcap is not None:
        raise ValueError("attend_f16 does not emulate a soft-capped attention")
    rep = q.shape[1] // k.shape[1]
    q, k, v = (t.half().float() for t in (q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)))
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)  # [B, H, Tq, Tk]
    if causal:
        n, m = q.shape[2], k.shape[2]
        mask = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, -1).half().float() @ v


@contextlib.contextmanager
def as_ggml(model: torch.nn.Module):
    """model's Linears (and lm_head) rounding their inputs as ggml does and its attention as llama.cpp's, inside."""
    hooks = [m.register_forward_pre_hook(ggml_rounding) for m in model.modules() if isinstance(m, (GgufLinear, torch.nn.Linear))]
    plain, attention.attend = attention.attend, attend_f16
    try:
        yield model
    finally:
        attention.attend = plain
        for h in hooks:
            h.remove()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return ((a - b).norm() / b.norm()).item()


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--tokens", required=True, help="token ids, comma-separated")
def main(path, tokens):
    ids = [int(t) for t in tokens.split(",")]
    theirs = {k: torch.from_numpy(v) for k, v in llamacpp_tensors(path, ids).items()}
    model = models.load_model(models.resolve(path)).float().eval()
    layers = {}
    for i, block in enumerate(model.model.layers):
        block.register_forward_hook(lambda m, a, out, i=i: layers.__setitem__(i, out[0] if isinstance(out, tuple) else out))
    with torch.no_grad(), as_ggml(model):
        logits = model(torch.tensor([ids]))  # [1, T, V]
    for i, out in sorted(layers.items()):
        hidden = theirs[f"l_out-{i}"].reshape(-1, out.shape[-1])  # [T, H]; the last layer's only where logits are asked
        first = len(ids) - hidden.shape[0]
        per_token = " ".join(f"{relative(out[0, first + t], hidden[t]):.1e}" for t in range(hidden.shape[0]))
        print(f"layer {i:2d} output, relative difference per token: {per_token}")
    last = theirs["result_output"].reshape(-1, logits.shape[-1])[-1]
    print(f"logits at the last token: relative difference {relative(logits[0, -1], last):.1e}")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
