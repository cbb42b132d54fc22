"""Facts about the decoder families we run, kept as data.

Every supported ``model_type`` maps to an :class:`Arch`. The decoder reads the flags once when it
builds its modules; the quantization searches read the scale groups (which Linears share an input,
and which op produces that input, so a per-channel scale can be folded into it). Numbers that a
checkpoint's config.json carries (soft-caps, multipliers, windows) are read into ``ModelConfig``.
"""

from dataclasses import dataclass, replace
from itertools import groupby


@dataclass(frozen=True)
class ScaleGroup:
    """Linears that read the same input, and the op whose output that input is.

    ``prev`` is a norm or a Linear inside the decoder layer; a per-input-channel scale s for
    ``linears`` is applied as ``prev.weight /= s`` (and its bias; for a norm of the (1+w) form,
    ``w' = (1 + w) / s - 1``) and ``linear.weight *= s``. ``prev=None``: nothing precedes the
    Linears that could take the scale (OLMo 2 reads the raw residual stream), so the group gets no
    scale search, only the clip search and rounding. ``module`` is the sub-module whose output
    measures the quantization error of the group.
    """

    prev: str | None
    linears: tuple[str, ...]
    module: str


@dataclass(frozen=True)
class Norms:
    """Names of a layer's RMSNorms by where they sit; None where the family has none there."""

    attn_in: str | None = "input_layernorm"  # on the residual stream, before attention
    attn_out: str | None = None  # on attention's output, before the residual add
    mlp_in: str | None = "post_attention_layernorm"
    mlp_out: str | None = None

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.attn_in, self.attn_out, self.mlp_in, self.mlp_out) if n)


E = "{e}"  # stands for an expert's index in a mixture-of-experts layer's names; see expand()


@dataclass(frozen=True)
class MoeFacts:
    """Where a mixture-of-experts layer keeps its parts, named as the hub stores them (vLLM reads the same).

    The block sits at ``block`` in place of the MLP and holds the router ``gate`` (Linear C -> E), the
    experts ``experts.{e}.<gate|up|down>`` (an MLP each) and, with ``shared`` (Qwen2-MoE), one always-on
    ``shared_expert`` MLP whose output is weighted by sigmoid(``shared_expert_gate``(x)). ``linears`` and
    ``scale_groups`` describe a whole MoE layer (its attention too), "{e}" standing for each expert's index.
    The router and the shared expert's gate read the experts' input, so they belong to that scale group
    (the scale is folded into them and routing stays the same) but not to ``linears``: they stay
    unquantized, as vLLM and llm-compressor keep them.
    """

    block: str  # "block_sparse_moe" (Mixtral) or "mlp" (Qwen)
    expert: tuple[str, str, str]  # an expert's gate, up and down Linears
    linears: tuple[str, ...]
    scale_groups: tuple[ScaleGroup, ...]
    shared: bool = False
    always_renormalize: bool = False  # top-k weights rescaled to sum 1 always (Mixtral); else as config's norm_topk_prob


@dataclass(frozen=True)
class Arch:
    model_type: str
    hf_class: str  # the transformers class that loads what we save
    scale_groups: tuple[ScaleGroup, ...]
    linears: tuple[str, ...]  # every Linear of a decoder layer, in execution order, as stored
    qkv_bias: bool = False  # q/k/v always have a bias (Qwen2); others follow config's attention_bias
    norms: Norms = Norms()
    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): Gemma's x * (1 + w)
    qk_norm: str | None = None  # "head": RMSNorm over each head's D (Qwen3, Gemma 3); "proj": over the whole projection (OLMo 2)
    fused: bool = False  # q/k/v stored as one qkv_proj and gate/up as one gate_up_proj (Phi-3)
    embed_scale_sqrt: bool = False  # embeddings times sqrt(hidden_size) (Gemma)
    unused_keys: tuple[str, ...] = ()  # config keys the family's transformers class reads but does not apply
    moe: MoeFacts | None = None  # the layers the config makes sparse hold this block instead of the MLP above


LLAMA_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)
FUSED_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
GATE_UP = ("mlp.gate_proj", "mlp.up_proj")


def groups(attn_prev: str | None, mlp_prev: str | None) -> tuple[ScaleGroup, ...]:
    """The Llama-layout groups (as llm-compressor's AWQ mappings) with the norms feeding q/k/v and gate/up.
    v -> o is folded per KV head under GQA: the scale of o's input channel h*D + d is the scale of v's
    output channel kv(h)*D + d."""
    return (
        ScaleGroup(attn_prev, QKV, "self_attn"),
        ScaleGroup("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj"),
        ScaleGroup(mlp_prev, GATE_UP, "mlp"),
        ScaleGroup("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
    )


LLAMA_GROUPS = groups("input_layernorm", "post_attention_layernorm")
GEMMA_NORMS = Norms("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
GEMMA = dict(scale_groups=groups("input_layernorm", "pre_feedforward_layernorm"), linears=LLAMA_LINEARS, norms=GEMMA_NORMS,
             norm_offset=1.0, embed_scale_sqrt=True)
# Phi-3's fused projections are one group each; o_proj and down_proj read slices of a fused output, so they get
# the clip search only (llm-compressor's phi3 mappings do the same).
PHI3_GROUPS = (
    ScaleGroup("input_layernorm", ("self_attn.qkv_proj",), "self_attn"),
    ScaleGroup(None, ("self_attn.o_proj",), "self_attn.o_proj"),
    ScaleGroup("post_attention_layernorm", ("mlp.gate_up_proj",), "mlp"),
    ScaleGroup(None, ("mlp.down_proj",), "mlp.down_proj"),
)

MLP_NAMES = ("gate_proj", "up_proj", "down_proj")


def moe(block: str, expert: tuple[str, str, str], shared: bool = False, always_renormalize: bool = False) -> MoeFacts:
    """A MoE layer's facts: Llama attention; post_attention_layernorm -> every expert's gate/up (and the shared
    expert's, the router, the shared gate) as one group; up -> down per expert and in the shared expert."""
    gate, up, down = (f"{block}.experts.{E}.{n}" for n in expert)
    mlp = tuple(f"{block}.shared_expert.{n}" for n in MLP_NAMES) if shared else ()  # its gate, up, down
    routers = (f"{block}.gate", *((f"{block}.shared_expert_gate",) if shared else ()))
    mlp_in = ScaleGroup("post_attention_layernorm", (gate, up, *mlp[:2], *routers), block)
    downs = (ScaleGroup(up, (down,), down), *((ScaleGroup(mlp[1], (mlp[2],), mlp[2]),) if shared else ()))
    return MoeFacts(block, expert, LLAMA_LINEARS[:4] + mlp + (gate, up, down), LLAMA_GROUPS[:2] + (mlp_in, *downs),
                    shared, always_renormalize)


def expand(linears: tuple[str, ...], experts: int) -> tuple[str, ...]:
    """``linears`` with each run of "{e}" names repeated in its place for experts 0..experts-1 (an expert's names together)."""
    out = []
    for per_expert, run in groupby(linears, key=lambda n: E in n):
        run = tuple(run)
        out += [n.replace(E, str(i)) for i in range(experts) for n in run] if per_expert else run
    return tuple(out)


def expand_groups(scale_groups: tuple[ScaleGroup, ...], experts: int) -> tuple[ScaleGroup, ...]:
    """A group whose ``prev`` is per expert becomes one group per expert; any other gets its "{e}" Linears expanded."""
    out = []
    for g in scale_groups:
        if g.prev is not None and E in g.prev:
            at = lambda name, i: name.replace(E, str(i))  # noqa: E731
            out += [ScaleGroup(at(g.prev, i), tuple(at(n, i) for n in g.linears), at(g.module, i)) for i in range(experts)]
        else:
            out.append(replace(g, linears=expand(g.linears, experts)))
    return tuple(out)


ARCHS = {
    "llama": Arch("llama", "LlamaForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS),
    "mistral": Arch("mistral", "MistralForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS),
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS, qkv_bias=True),
    "qwen3": Arch("qwen3", "Qwen3ForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS, qk_norm="head"),
    "granite": Arch("granite", "GraniteForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS),
    "gemma2": Arch("gemma2", "Gemma2ForCausalLM", **GEMMA),
    # Gemma 3's config inherits attn_logit_softcapping from Gemma 2's, but its attention never applies it.
    "gemma3_text": Arch("gemma3_text", "Gemma3ForCausalLM", **GEMMA, qk_norm="head", unused_keys=("attn_logit_softcapping",)),
    "phi3": Arch("phi3", "Phi3ForCausalLM", PHI3_GROUPS, FUSED_LINEARS, fused=True),
    # OLMo 2 normalizes sublayer outputs only: q/k/v and gate/up read the raw residual stream.
    "olmo2": Arch("olmo2", "Olmo2ForCausalLM", groups(None, None), LLAMA_LINEARS,
                  norms=Norms(None, "post_attention_layernorm", None, "post_feedforward_layernorm"), qk_norm="proj"),
    # Mixtures of experts: ``linears`` / ``scale_groups`` above are their dense layers' (Qwen's mlp_only_layers).
    "mixtral": Arch("mixtral", "MixtralForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS,
                    moe=moe("block_sparse_moe", ("w1", "w3", "w2"), always_renormalize=True)),
    "qwen2_moe": Arch("qwen2_moe", "Qwen2MoeForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS, moe=moe("mlp", MLP_NAMES, shared=True)),
    "qwen3_moe": Arch("qwen3_moe", "Qwen3MoeForCausalLM", LLAMA_GROUPS, LLAMA_LINEARS, qk_norm="head", moe=moe("mlp", MLP_NAMES)),
}

# The Llama layout's Linears (reports and tests that name them; a model's own are ``cfg.arch.linears``).
LAYER_LINEARS = LLAMA_LINEARS
