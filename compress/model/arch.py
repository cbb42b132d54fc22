"""Facts about the Llama-family architectures we run, kept as data.

Every supported ``model_type`` maps to an :class:`Arch`. The decoder reads the flags; the
quantization searches read the scale groups (which Linears share an input, and which op
produces that input, so a per-channel scale can be folded into it).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class ScaleGroup:
    """Linears that read the same input, and the op whose output that input is.

    ``prev`` is a norm or a Linear inside the decoder layer; a per-input-channel scale s for
    ``linears`` is applied as ``prev.weight /= s`` (and its bias) and ``linear.weight *= s``.
    ``module`` is the sub-module whose output measures the quantization error of the group.
    """

    prev: str
    linears: tuple[str, ...]
    module: str


@dataclass(frozen=True)
class Arch:
    model_type: str
    hf_class: str  # the transformers class that loads what we save
    qkv_bias: bool
    scale_groups: tuple[ScaleGroup, ...]
    # Keys of config.json that name the same fact differently per architecture.
    sliding_window_key: str | None = None


# Names relative to one decoder layer, in Hugging Face's layout (as llm-compressor's AWQ
# mappings). v -> o is folded per KV head under GQA: the scale of o's input channel h*D + d
# is the scale of v's output channel kv(h)*D + d.
LLAMA_GROUPS = (
    ScaleGroup("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn"),
    ScaleGroup("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj"),
    ScaleGroup("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
    ScaleGroup("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
)

ARCHS = {
    "llama": Arch("llama", "LlamaForCausalLM", qkv_bias=False, scale_groups=LLAMA_GROUPS),
    "mistral": Arch("mistral", "MistralForCausalLM", qkv_bias=False, scale_groups=LLAMA_GROUPS, sliding_window_key="sliding_window"),
    "qwen2": Arch("qwen2", "Qwen2ForCausalLM", qkv_bias=True, scale_groups=LLAMA_GROUPS),
}

# Every Linear of a decoder layer, in execution order.
LAYER_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)
