"""PruneConfig and DistillConfig: the knobs of `compress prune-distill`, validated on construction."""

from dataclasses import dataclass

from compress.errors import UserError

IMPORTANCE = ("activation", "magnitude", "random")


def parse_count(text: str | int | None) -> int | None:
    """'95M', '1.5B', '300k' or a plain integer."""
    if text is None or isinstance(text, int):
        return text
    scale = {"k": 10**3, "m": 10**6, "b": 10**9}.get(text[-1:].lower(), 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise UserError(f"'{text}' is not a count; write e.g. 95M, 300k or 95000000") from None


@dataclass
class PruneConfig:
    target_params: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    num_layers: int | None = None
    importance: str = "activation"
    calib_data: str | None = None
    calib_samples: int = 128
    calib_seq_len: int = 256
    seed: int = 0

    @property
    def explicit(self) -> bool:
        return any(v is not None for v in (self.hidden_size, self.intermediate_size, self.num_heads,
                                           self.num_kv_heads, self.num_layers))

    def __post_init__(self):
        if self.importance not in IMPORTANCE:
            raise UserError(f"--importance must be one of {', '.join(IMPORTANCE)}, got {self.importance}")
        if (self.target_params is None) == (not self.explicit):
            raise UserError("give either --target-params or explicit sizes (--hidden-size, --intermediate-size, "
                            "--num-heads, --num-kv-heads, --num-layers), not both and not neither")
        if self.target_params is not None and self.target_params <= 0:
            raise UserError(f"--target-params must be positive, got {self.target_params}")
        for name in ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "num_layers"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.calib_samples < 1 or self.calib_seq_len < 2:
            raise UserError("--calib-samples must be >= 1 and --calib-seq-len >= 2")


@dataclass
class DistillConfig:
    tokens: int = 300_000  # training token budget (student tokens seen)
    seq_len: int = 256
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup: float = 0.05  # share of steps with linear warmup
    temperature: float = 1.0
    hidden_weight: float = 0.0  # weight of the projected final-hidden-state MSE; 0 = logits only
    eval_every: int = 25  # steps between held-out perplexity evaluations
    save_every: int = 25  # steps between resumable checkpoints
    eval_rows: int = 16  # held-out rows of seq_len tokens (never trained on)
    data: str | None = None
    seed: int = 0

    def __post_init__(self):
        for name in ("seq_len", "batch_size", "grad_accum", "eval_every", "save_every", "eval_rows"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.temperature <= 0 or self.hidden_weight < 0:
            raise UserError("--lr and --temperature must be positive and --hidden-weight >= 0")
        if self.steps < 1:
            raise UserError(f"--tokens {self.tokens} is below one step of {self.tokens_per_step} tokens "
                            f"(--batch-size x --grad-accum x --seq-len)")

    def check_processes(self, processes: int) -> None:
        """--batch-size is the global micro-batch: it must split evenly over the processes."""
        if self.batch_size % processes:
            raise UserError(f"--batch-size {self.batch_size} (rows a micro-batch, over all processes) does not split "
                            f"over {processes} processes; use a multiple of {processes}")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.seq_len

    @property
    def steps(self) -> int:
        return self.tokens // self.tokens_per_step
