"""The mixture-of-experts block a sparse layer holds in place of its MLP (Mixtral, Qwen2-MoE, Qwen3-MoE).

Module names are the hub's, so a checkpoint loads as is: Mixtral's ``block_sparse_moe.gate`` (the router) and
``block_sparse_moe.experts.N.w1 / w3 / w2`` (gate, up, down); Qwen's ``mlp.gate`` and
``mlp.experts.N.gate_proj / up_proj / down_proj``, plus Qwen2-MoE's ``mlp.shared_expert`` (an MLP) and
``mlp.shared_expert_gate``. That per-expert layout is what the hub's safetensors hold, what transformers'
``save_pretrained`` writes and what vLLM reads. transformers 5 keeps the experts fused in memory instead
(``mlp.experts.gate_up_proj`` [E, 2I, C], gate rows then up rows, and ``mlp.experts.down_proj`` [E, C, I],
with Mixtral's block renamed ``mlp``) and converts on load and save; ``hub_layout`` does that conversion
for a state dict taken from a transformers model in memory.

The forward routes each token to its top-k experts (softmax over the router's logits in fp32), groups the
tokens by expert and runs each chosen expert once on its own tokens: no [tokens x experts x width] tensor,
and an expert no token chose is never touched. Calibration and the CPU runtime run this same code; on CUDA the
runtime gives a block whose experts are all int4 of one spec a ``fused`` callable (``runtime/fused_experts.py``:
the experts stacked, one Triton kernel over all of them), which then computes the routed experts instead.
"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from compress.model.arch import MLP_NAMES
from compress.model.config import ModelConfig


class Expert(nn.Module):
    """down(act(gate(x)) * up(x)) with the family's names for gate, up and down (Mixtral's w1, w3, w2)."""

    def __init__(self, names: tuple[str, str, str], hidden: int, width: int, act: Callable):
        super().__init__()
        self.names, self.act = names, act
        for name, (fan_in, fan_out) in zip(names, ((hidden, width), (hidden, width), (width, hidden))):
            setattr(self, name, nn.Linear(fan_in, fan_out, bias=False))
        self.gate_up = None  # the CPU runtime's gate and up as one Linear (runtime/cpu_fusion.py), replacing the two

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, -1)  # views of [N, 2 * width]
        else:
            gate, up = (getattr(self, n)(x) for n in self.names[:2])
        return getattr(self, self.names[2])(self.act(gate) * up)  # [N, C] of x [N, C]


def top_experts(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities, experts) [..., K] of the router's logits [..., E]: the top-k of a softmax taken in fp32."""
    return F.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)


class SparseMoe(nn.Module):
    def __init__(self, cfg: ModelConfig, act: Callable):
        super().__init__()
        C, m, facts = cfg.hidden_size, cfg.moe, cfg.arch.moe
        self.gate = nn.Linear(C, m.num_experts, bias=False)  # the router
        self.experts = nn.ModuleList(Expert(facts.expert, C, m.width, act) for _ in range(m.num_experts))
        if facts.shared:  # always on, weighted by sigmoid(shared_expert_gate(x)) (Qwen2-MoE)
            self.shared_expert = Expert(MLP_NAMES, C, m.shared_width, act)
            self.shared_expert_gate = nn.Linear(C, 1, bias=False)
        self.shared = facts.shared
        self.top_k, self.renormalize = m.top_k, m.renormalize
        self.calibrating = False  # run_expert: every expert on every token, the output still routed
        self.fused = None  # (x [N, C], weights [N, K], experts [N, K]) -> the routed experts' sum [N, C] (runtime/fused_experts.py)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [N, K] in x's dtype, experts [N, K]) of x [N, C]: the top-k of a softmax taken in fp32."""
        weights, experts = top_experts(self.gate(x), self.top_k)  # [N, K]
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape  # [B, T, C]
        x = x.reshape(-1, shape[-1])  # [N, C]
        weights, experts = self.route(x)  # [N, K]
        fused = self.fused is not None and not self.calibrating
        out = self.fused(x, weights, experts) if fused else self.routed(x, shape, weights, experts)  # [N, C]
        if self.shared:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x.view(shape)).view(x.shape)
        return out.view(shape)

    def routed(self, x: torch.Tensor, shape: torch.Size, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """sum_k weights[:, k] * expert_k(x) [N, C] of x [N, C]: each chosen expert run once over its tokens."""
        out = torch.zeros_like(x)  # [N, C]
        slots = experts.flatten().argsort(stable=True)  # [N K]: the (token, k) slots sorted by expert
        counts = torch.bincount(experts.flatten(), minlength=len(self.experts)).tolist()
        tokens, slot_weights = slots // self.top_k, weights.flatten()[slots]  # [N K] each
        start = 0
        for expert, n in zip(self.experts, counts):
            if n or self.calibrating:  # an expert no token chose is skipped, but in calibration
                rows = tokens[start:start + n]  # [n]
                out.index_add_(0, rows, self.run_expert(expert, x, shape, rows) * slot_weights[start:start + n, None])
            start += n
        return out

    def run_expert(self, expert: Expert, x: torch.Tensor, shape: torch.Size, rows: torch.Tensor) -> torch.Tensor:
        """expert(x[rows]) [n, C] of x [N, C]; calibrating, the expert runs on every token as ``shape`` (what hooks
        on its Linears record: quantization's "calibrate all experts", quant/moe_calib.py), then its rows are taken."""
        if self.calibrating:
            return expert(x.view(shape)).view(x.shape)[rows]
        return expert(x[rows])


def hub_layout(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A state dict from a transformers model in memory with its experts as the hub stores them (one Linear
    each, under the family's block name); tensors already in that layout pass unchanged."""
    facts = cfg.arch.moe
    if facts is None:
        return state
    out = {}
    for key, t in state.items():
        head, sep, tail = key.partition(".mlp.")
        if not sep or not cfg.is_moe(int(head.rsplit(".", 1)[1])):
            out[key] = t
        elif tail in FUSED:
            out |= {f"{head}.{facts.block}.experts.{e}.{name}.weight": w
                    for e, layer in enumerate(t) for name, w in FUSED[tail](facts.expert, layer)}
        else:
            out[f"{head}.{facts.block}.{tail}"] = t
    return out


FUSED = {  # transformers' fused expert tensor -> (Linear name, weight) of one expert, from its [2I, C] or [C, I] slice
    "experts.gate_up_proj": lambda names, w: zip(names[:2], w.chunk(2)),
    "experts.down_proj": lambda names, w: [(names[2], w)],
}
