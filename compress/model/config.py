"""ModelConfig: the numbers the decoder needs, read from (and written to) config.json."""

from dataclasses import dataclass, field

from compress.errors import UserError
from compress.model.arch import ARCHS, Arch

ROPE_TYPES = ("default", "linear", "llama3")
REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


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
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    extra: dict = field(default_factory=dict)  # everything else in config.json, written back as is

    def __post_init__(self):
        if self.model_type not in ARCHS:
            raise UserError(
                f"unsupported model_type '{self.model_type}': supported are {', '.join(sorted(ARCHS))}"
            )
        if self.num_heads % self.num_kv_heads:
            raise UserError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_key_value_heads={self.num_kv_heads}"
            )
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise UserError(f"unsupported rope scaling '{rope_type}': supported are {', '.join(ROPE_TYPES)}")

    @property
    def arch(self) -> Arch:
        return ARCHS[self.model_type]

    @classmethod
    def from_hf(cls, d: dict) -> "ModelConfig":
        d = dict(d)
        d.pop("quantization_config", None)  # the quantized loaders read it themselves
        if "model_type" not in d:
            raise UserError("config.json has no model_type; is this a Hugging Face causal LM checkpoint?")
        missing = [k for k in REQUIRED_KEYS if k not in d]
        if missing:
            raise UserError(f"config.json of this {d['model_type']} model lacks {', '.join(missing)}; re-download or fix the checkpoint's config.json")
        heads = d.pop("num_attention_heads")
        rope = d.pop("rope_parameters", None) or {}
        scaling = d.pop("rope_scaling", None) or {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        elif "rope_type" not in scaling:
            scaling = {**scaling, "rope_type": scaling["type"]}
        theta = d.pop("rope_theta", None) or rope.get("rope_theta", 10000.0)
        arch = ARCHS.get(d["model_type"])
        window = d.pop(arch.sliding_window_key, None) if arch and arch.sliding_window_key else None
        return cls(
            model_type=d.pop("model_type"),
            vocab_size=d.pop("vocab_size"),
            hidden_size=d["hidden_size"],
            intermediate_size=d.pop("intermediate_size"),
            num_layers=d.pop("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=d.pop("num_key_value_heads", None) or heads,
            head_dim=d.pop("head_dim", None) or d["hidden_size"] // heads,
            rms_norm_eps=d.pop("rms_norm_eps", 1e-5),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=d.pop("max_position_embeddings", 2048),
            tie_word_embeddings=d.pop("tie_word_embeddings", False),
            sliding_window=window,
            bos_token_id=d.pop("bos_token_id", None),
            eos_token_id=d.pop("eos_token_id", None),
            extra={k: v for k, v in d.items() if k != "hidden_size"},
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
            rope_theta=self.rope_theta,
            rope_scaling=self.rope_scaling,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
        )
        if self.arch.sliding_window_key:
            d[self.arch.sliding_window_key] = self.sliding_window
        return d
