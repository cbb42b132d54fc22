"""Facts about the decoder families we run, kept as data.

Every supported ``model_type`` maps to an :class:`Arch`. The decoder reads the flags once when it
builds its modules; the quantization searches read the scale groups (which Linears share an input,
and which op produces that input, so a per-channel scale can be folded into it). Numbers that a
checkpoint's config.json carries (soft-caps, multipliers, windows) are read into ``ModelConfig``.
"""

from dataclasses import dataclass


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
}

# The Llama layout's Linears (reports and tests that name them; a model's own are ``cfg.arch.linears``).
LAYER_LINEARS = LLAMA_LINEARS
