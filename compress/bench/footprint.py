"""The bytes a decode step reads: the weights as the engine holds them, and the KV cache of each sequence.

Counted from the tensors themselves (parameters and buffers; a tied weight once), not from a
formula. A step reads every weight once, except an embedding table the lm_head does not share,
of which it reads only the rows of its tokens (left out here); a shared table is read whole by the
lm_head. On CPU the engine keeps fp32 weights as they are (`cpu_linears`; a tied lm_head shares the
table) and holds int4/int3 PackedLinears as 4-bit nibbles with an fp32 scale and offset per group
(dequantized to dense only where that kernel cannot build; the scratch buffer of their torch path,
used at large row counts, is not counted);
`stored` is the checkpoint as loaded before that swap, which is what the CUDA path keeps and reads.
A mixture of experts' step reads only the routed experts: their bytes count at the share of experts a
batch chooses (``roofline.expert_share``: k/E at batch 1, uniform routing beyond).
"""

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from compress.model.config import ModelConfig
from compress.model.moe import SparseMoe
from compress.models import is_quantized, load_model
from compress.roofline import expert_share, kv_bytes_per_token


@dataclass(frozen=True)
class Footprint:
    stored: int  # weight bytes a step reads with the checkpoint's own storage (int4/int3 packed)
    read: int  # weight bytes a step reads on this engine (CPU: as cpu_linears holds them)
    kv_per_token: int  # K and V bytes of one cached token, all layers, in the engine's dtype
    cfg: ModelConfig | None = None  # for the routed share of the experts
    experts: tuple[int, int] = (0, 0)  # routed experts' bytes within (stored, read)

    def step_bytes(self, batch: int, context: int, stored: bool = False) -> int:
        """Bytes one decode step at batch `batch` reads, each sequence `context` tokens long."""
        weights, experts = (self.stored, self.experts[0]) if stored else (self.read, self.experts[1])
        unread = experts * (1 - expert_share(self.cfg, batch)) if experts else 0
        return int(weights - unread) + batch * context * self.kv_per_token


def tensor_bytes(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers; a tied weight counts once."""
    return sum(t.nbytes for t in (*module.parameters(), *module.buffers()))


def step_weight_bytes(model: nn.Module) -> int:
    """Weight bytes a decode step reads: all of them but an embedding table the lm_head does not share."""
    table = model.model.embed_tokens.weight
    shared = getattr(model.lm_head, "weight", None) is table
    return tensor_bytes(model) - (0 if shared else table.nbytes)


def expert_bytes(model: nn.Module) -> int:
    """Bytes of every routed expert (not a shared one): what a step reads only in part."""
    return sum(tensor_bytes(m.experts) for m in model.modules() if isinstance(m, SparseMoe))


def footprint(llm, model_dir: Path) -> Footprint:
    """The Footprint of an engine built from model_dir (a quantized checkpoint is loaded again to count it as stored)."""
    model = llm.runner.model
    read, read_experts = step_weight_bytes(model), expert_bytes(model)
    stored, stored_experts = read, read_experts
    if is_quantized(model_dir):
        as_stored = load_model(model_dir, llm.config.torch_dtype)
        stored, stored_experts = step_weight_bytes(as_stored), expert_bytes(as_stored)
    return Footprint(stored, read, kv_bytes_per_token(model.cfg, llm.runner.kv.element_size()), model.cfg,
                     (stored_experts, read_experts))
