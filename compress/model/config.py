"""ModelConfig: the numbers the decoder needs, read from (and written to) config.json.

A checkpoint's config.json is first read by transformers' own config class for its model_type, so
that every default and legacy spelling (``rope_scaling`` vs ``rope_parameters``, Gemma 2's soft-caps
when absent, Qwen's ``use_sliding_window``, Gemma 3's ``rope_local_base_freq``) means what it means
to transformers. The facts the decoder uses are then taken from that normalized config by key: a key
present in a family's config is the fact (``attn_logit_softcapping``, ``embedding_multiplier``...),
never a test of the model_type.
"""

from dataclasses import dataclass, field

from compress.errors import UserError
from compress.model.arch import ARCHS, Arch, ScaleGroup, expand, expand_groups
from compress.model.attention import AttentionSpec

ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "gelu")
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
SLIDING = "sliding_attention"
# config.json keys that hold the rotary embedding's settings: written back as the source had them.
ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq", "partial_rotary_factor")
REFUSED = {
    "gemma3": "a Gemma 3 multimodal checkpoint (Gemma3ForConditionalGeneration); compress handles text decoders only: "
              "use a gemma3_text checkpoint (e.g. google/gemma-3-1b-it) or save the language model alone",
}
# Switches of a config.json that change the computation in ways this decoder does not implement.
UNSUPPORTED_FLAGS = {
    "mlp_bias": "MLP biases are not implemented; models with them cannot be run or quantized here",
    "use_bidirectional_attention": "bidirectional (embedding-model) attention is not implemented; only causal decoders are",
}


@dataclass(frozen=True)
class MoeConfig:
    """A mixture of experts' numbers (router jitter and aux-loss settings are training-only and ignored)."""

    num_experts: int
    top_k: int  # experts per token
    width: int  # an expert's intermediate size (Mixtral's intermediate_size, Qwen's moe_intermediate_size)
    layers: tuple[int, ...]  # the layers that hold the MoE block; the others hold the dense MLP of intermediate_size
    renormalize: bool = True  # top-k router weights rescaled to sum 1
    shared_width: int = 0  # the shared expert's intermediate size (Qwen2-MoE)


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # the global layers' scaling (rope_type and its parameters); None: default
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    extra: dict = field(default_factory=dict)  # everything else in config.json, written back as is
    layer_types: tuple[str, ...] | None = None  # per layer "sliding_attention" / "full_attention"; None: sliding_window on all
    local_rope: dict | None = None  # sliding layers' own rope parameters (Gemma 3); None: the global ones
    partial_rotary_factor: float = 1.0  # the fraction of head_dim rotated (Phi-4-mini: 0.75)
    hidden_act: str = "silu"
    attention_bias: bool = False  # bias on q, k, v and o
    attn_scale: float | None = None  # None: head_dim ** -0.5
    attn_softcap: float | None = None  # scores = cap * tanh(scores / cap)
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap)
    embed_multiplier: float = 1.0  # Granite's embedding_multiplier (Gemma's sqrt(hidden) is on Arch)
    residual_multiplier: float = 1.0
    logits_divisor: float = 1.0  # Granite's logits_scaling
    qkv_bias: bool = False  # config's qkv_bias (Qwen2-MoE): q/k/v have a bias, o does not
    moe: MoeConfig | None = None  # from config.json's own keys, which to_hf writes back as they were (``extra``)

    def __post_init__(self):
        check_model_type(self.model_type)
        if self.num_heads % self.num_kv_heads:
            raise UserError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        for params in (self.rope_scaling, self.local_rope):
            rope_type = (params or {}).get("rope_type", "default")
            if rope_type not in ROPE_TYPES:
                raise UserError(f"unsupported rope scaling '{rope_type}': supported are {', '.join(ROPE_TYPES)}")
        if self.hidden_act not in ACTIVATIONS:
            raise UserError(f"unsupported activation '{self.hidden_act}': supported are {', '.join(ACTIVATIONS)}")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise UserError(f"config.json's layer_types has {len(self.layer_types)} entries for {self.num_layers} layers; fix the checkpoint's config.json")

    @property
    def arch(self) -> Arch:
        return ARCHS[self.model_type]

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of ``layer`` (keys at distance < window are seen), None for full attention."""
        if self.sliding_window is None or (self.layer_types is not None and self.layer_types[layer] != SLIDING):
            return None
        return self.sliding_window

    def is_moe(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.layers

    def layer_linears(self, layer: int) -> tuple[str, ...]:
        """Every Linear of ``layer`` by name (a MoE layer's experts one by one; its router is not among them)."""
        return expand(self.arch.moe.linears, self.moe.num_experts) if self.is_moe(layer) else self.arch.linears

    def layer_groups(self, layer: int) -> tuple[ScaleGroup, ...]:
        return expand_groups(self.arch.moe.scale_groups, self.moe.num_experts) if self.is_moe(layer) else self.arch.scale_groups

    def windows(self) -> list[int | None]:
        return [self.layer_window(i) for i in range(self.num_layers)]

    def layer_rope(self, layer: int) -> int:
        """Which rotary table ``layer`` uses: 0 the global one, 1 the sliding layers' own (``local_rope``)."""
        return int(self.local_rope is not None and self.layer_window(layer) is not None)

    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim**-0.5

    def attention(self) -> AttentionSpec:
        return AttentionSpec(tuple(self.windows()), self.scale(), self.attn_softcap)

    def plain_attention(self) -> bool:
        """Causal attention over every earlier token with no soft-cap: what every attention kernel runs."""
        return self.attention().plain()

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        if "model_type" not in d:
            raise UserError("config.json has no model_type; is this a Hugging Face causal LM checkpoint?")
        d = {k: v for k, v in d.items() if k != "quantization_config"}  # the quantized loaders read it themselves
        model_type = d["model_type"]
        check_model_type(model_type)
        missing = [k for k in REQUIRED_KEYS if k not in d]
        if missing:
            raise UserError(f"config.json of this {model_type} model lacks {', '.join(missing)}; re-download or fix the checkpoint's config.json")
        hf = {k: v for k, v in normalized(d).items() if k not in ARCHS[model_type].unused_keys}
        for key, why in UNSUPPORTED_FLAGS.items():
            if hf.get(key):
                raise UserError(f"this {model_type} config.json sets {key}: {why}")
        heads = hf["num_attention_heads"]
        rope, local = rope_parameters(hf)
        taken = {"model_type", "vocab_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "sliding_window", "bos_token_id",
                 "eos_token_id", "layer_types"}
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=rope["rope_theta"],
            rope_scaling=None if rope.get("rope_type", "default") == "default" else {k: v for k, v in rope.items() if k != "rope_theta"},
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", hf.get("tie_word_embeddings", False))),
            sliding_window=hf.get("sliding_window") or None,  # Qwen2-MoE says 0 for none
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            extra={k: v for k, v in d.items() if k not in taken and k != "hidden_size"},
            layer_types=tuple(hf["layer_types"]) if hf.get("layer_types") else None,
            local_rope=local,
            partial_rotary_factor=rope.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0,
            hidden_act=hf.get("hidden_activation") or hf.get("hidden_act") or "silu",
            attention_bias=bool(hf.get("attention_bias")),
            attn_scale=attention_scale(hf),
            attn_softcap=hf.get("attn_logit_softcapping"),
            final_softcap=hf.get("final_logit_softcapping"),
            embed_multiplier=hf.get("embedding_multiplier", 1.0),
            residual_multiplier=hf.get("residual_multiplier", 1.0),
            logits_divisor=hf.get("logits_scaling", 1.0),
            qkv_bias=bool(hf.get("qkv_bias")),
            moe=moe_config(hf, ARCHS[model_type]),
        )

    def to_hf(self) -> dict:
        """config.json contents that transformers reads as the same model."""
        d = dict(self.extra)
        d.update(
            model_type=self.model_type,
            architectures=[self.arch.hf_class],
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            sliding_window=self.sliding_window,
        )
        if not any(k in self.extra for k in ROPE_KEYS):  # built in code, not read from a config.json
            d.update(rope_theta=self.rope_theta, rope_scaling=self.rope_scaling)
        if self.layer_types is not None:
            d["layer_types"] = list(self.layer_types)
        return d


def check_model_type(model_type: str) -> None:
    if model_type not in ARCHS:
        why = REFUSED.get(model_type)
        raise UserError(f"'{model_type}' is {why}" if why else
                        f"unsupported model_type '{model_type}': supported are {', '.join(sorted(ARCHS))}")


def moe_config(hf: dict, arch: Arch) -> MoeConfig | None:
    """The experts' numbers of a normalized config, as transformers builds the layers: layer i is sparse unless it is
    in mlp_only_layers or (i + 1) is not a multiple of decoder_sparse_step (keys Mixtral lacks: every layer)."""
    if arch.moe is None:
        return None
    experts, top_k = hf.get("num_local_experts") or hf.get("num_experts") or 0, hf["num_experts_per_tok"]
    if experts and top_k > experts:
        raise UserError(f"this {arch.model_type} config.json routes each token to num_experts_per_tok={top_k} experts "
                        f"of {experts}; fix the checkpoint's config.json")
    step, dense = hf.get("decoder_sparse_step") or 1, set(hf.get("mlp_only_layers") or ())
    layers = tuple(i for i in range(hf["num_hidden_layers"]) if experts and i not in dense and (i + 1) % step == 0)
    return MoeConfig(experts, top_k, hf.get("moe_intermediate_size") or hf["intermediate_size"], layers,
                     arch.moe.always_renormalize or bool(hf.get("norm_topk_prob")),
                     hf.get("shared_expert_intermediate_size", 0) if arch.moe.shared else 0)


def normalized(d: dict) -> dict:
    """config.json as transformers' config class for its model_type reads it: defaults filled, legacy keys converted."""
    from transformers import AutoConfig

    try:
        return AutoConfig.for_model(**d).to_dict()
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"transformers cannot read this {d['model_type']} config.json ({str(e).splitlines()[0]}); fix the checkpoint's config.json") from e


def rope_parameters(hf: dict) -> tuple[dict, dict | None]:
    """(the global layers' rope parameters, the sliding layers' own or None) of a normalized config."""
    params = hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": hf.get("rope_theta", 10000.0)}
    if "full_attention" in params:  # per layer type (Gemma 3)
        glob, local = params["full_attention"], params.get(SLIDING)
        return glob, None if local is None or local == glob else local
    return params, None


def attention_scale(hf: dict) -> float | None:
    """Granite's attention_multiplier, Gemma's query_pre_attn_scalar ** -0.5, else None (head_dim ** -0.5)."""
    if hf.get("attention_multiplier") is not None:
        return float(hf["attention_multiplier"])
    if hf.get("query_pre_attn_scalar") is not None:
        return float(hf["query_pre_attn_scalar"]) ** -0.5
    return None
