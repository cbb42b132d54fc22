"""What `compress prune-distill` needs in memory, from config numbers alone (nothing is loaded).

The terms follow what prune_distill.py and distill.py do:

- teacher: every parameter in the dtype it is loaded in (fp32 today), frozen, no gradients.
- student: trained in fp32 by AdamW: weights, gradients, exp_avg and exp_avg_sq, 16 bytes a
  parameter; under bf16 autocast (CUDA) also the bf16 copies of its weights that autocast keeps for
  the backward, 2 more. The `--hidden-weight` projection (Cs x Ct) is trained with it.
- activations: what the student's forward saves for the backward, per token and layer
  (`per_token_layer`; SDPA stores no T x T scores): the fp32 input of each of the family's RMSNorms
  (and of its q/k norms), the inputs of the Linears (under autocast one bf16 cast of the normed x per
  Linear that reads it: five, or two where q/k/v and gate/up are fused), rotated q
  and k, v, the attention output, and the MLP's gate, silu(gate), up and their product; one more
  layer for the gradients of the backward.
- logits: KD over the whole vocabulary, one micro-batch at a time: the teacher's and the
  student's logits in the compute dtype (alive until the loss returns), their fp32 log-softmax
  outputs and about three fp32 [tokens, V] temporaries inside the KL (LOGIT_COPIES = 5 fp32).

Checked on CPU (fp32; the growth of peak RSS over one training step of random models, hidden
128-1024): the logits term within 3 % (vocab 32000), activations 10-20 % high. The bf16 (CUDA)
numbers follow the same count and have not been measured.

Without distillation (`--no-distill`) it is the two models and one no-grad calibration batch.

Sharded (FSDP, prune/sharding.py) over N processes: the teacher's weights and the student's 16 bytes a
parameter are split N ways; the bf16 copies autocast keeps are not (it caches a cast of each whole weight
as it is used); gathered at a time, whole: both models' outer unit (embedding, lm_head, final norm; the
root unit stays gathered for the step) and two student blocks (the one running and the one prefetched)
with their gradients, two teacher blocks. Every process first loads the whole teacher and builds the
whole student in fp32 on the host before sharding them: on the host that load is the peak when larger.
"""

from dataclasses import dataclass

from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.prune.config import DistillConfig, PruneConfig
from compress.prune.shape import Shape, param_count

GiB = 1 << 30
ADAMW_FP32 = 4 * 4  # weights, gradients, exp_avg, exp_avg_sq
LOGIT_COPIES = 5  # fp32 [tokens, V]: two log-softmax outputs kept for the backward, ~3 temporaries in the KL
CALIB_BATCH = 8  # activation_importance's batch
DDP_BUCKETS = 4  # DDP all-reduces fp32 gradients through buckets of their size


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes, by what holds them."""

    teacher_params: int
    teacher_bytes: int  # per parameter
    student_params: int
    student_bytes: float  # per parameter (16 trained, + 2 under autocast; 4 when only pruned; 16/N + 2 sharded)
    activations: int
    logits: int
    tokens: int  # per micro-batch
    training: bool
    ddp: bool = False  # several processes: DDP's gradient buckets are in student_bytes
    shards: int = 1  # FSDP: the teacher and the student's trained bytes are split this many ways
    gathered: int = 0  # FSDP: the units gathered whole at a time
    loads_on_host: bool = False  # FSDP without a GPU: the whole models are loaded where it trains, then split

    @property
    def teacher(self) -> int:
        return self.teacher_params * self.teacher_bytes // self.shards

    @property
    def student(self) -> int:
        return int(self.student_params * self.student_bytes)

    @property
    def whole_models(self) -> int:
        """Both models whole in fp32: what every process holds on the host before they are split or moved."""
        return (self.teacher_params + self.student_params) * 4

    @property
    def loading(self) -> int:
        return self.whole_models if self.loads_on_host else 0

    @property
    def training_total(self) -> int:
        return self.teacher + self.student + self.activations + self.logits + self.gathered

    @property
    def total(self) -> int:
        return max(self.training_total, self.loading)

    def describe(self) -> str:
        """One line: 'teacher 29.9 GiB fp32, student 67.2 GiB (4.51B x 16 bytes: fp32 weights, grads, AdamW), ...'."""
        dtype = {4: "fp32", 2: "bf16", 1: "fp8"}.get(self.teacher_bytes, f"{self.teacher_bytes} bytes")
        autocast = self.student_bytes - (DDP_BUCKETS if self.ddp else 0) > ADAMW_FP32 / self.shards
        held = ("fp32 weights, grads, AdamW" + (f" split {self.shards} ways" if self.shards > 1 else "")
                + (", bf16 copy" if autocast else "") + (", DDP buckets" if self.ddp else "")
                if self.training else "fp32 weights")
        split = f" (1/{self.shards})" if self.shards > 1 else ""
        text = (f"teacher {size(self.teacher)} {dtype}{split}, student {size(self.student)} "
                f"({self.student_params / 1e9:.2f}B x {self.student_bytes:g} bytes: {held}), "
                f"activations {size(self.activations)}, logits {size(self.logits)} "
                f"({self.tokens:,} tokens a micro-batch)")
        if self.shards > 1:
            text += f", gathered {size(self.gathered)}"
        if self.loading > self.training_total:
            text += f"; loading the whole models before sharding {size(self.loading)}"
        return text

    def table(self) -> str:
        """The same numbers as a markdown table (docs/prune.md has the one for Llama-3-8B)."""
        rows = [("teacher", self.teacher_params, self.teacher_bytes / self.shards, self.teacher),
                ("student", self.student_params, self.student_bytes, self.student),
                ("activations", None, None, self.activations), ("logits", None, None, self.logits)]
        rows += [("gathered", None, None, self.gathered)] if self.shards > 1 else []
        rows += [("total", None, None, self.total)]
        lines = ["| | parameters | bytes each | GiB |", "|---|---:|---:|---:|"]
        for name, n, each, size in rows:
            lines.append(f"| {name} | {f'{n / 1e9:.2f}B' if n else ''} | {f'{each:g}' if each else ''} | {gib(size)} |")
        return "\n".join(lines)


def check(est: MemoryEstimate, available: int, where: str, copies: int = 1) -> None:
    """One UserError line when `copies` of est (processes sharing the memory) do not fit in `available` bytes
    ('this machine has' / 'the GPU has')."""
    if est.total * copies <= available:
        return
    fix = ("use a GPU with more memory, or a smaller --batch-size or --seq-len (--grad-accum keeps the tokens "
           "a step)" if est.training else "use a machine with more memory")
    if copies > 1:
        fix = f"start fewer processes, or {fix}"
    raise UserError(f"prune-distill needs about {size(est.total * copies)} ({times(copies)}{est.describe()}); "
                    f"{where} {size(available)} available: {fix} (docs/prune.md, Memory)")


def check_loading(est: MemoryEstimate, available: int, copies: int) -> None:
    """One UserError line when the host cannot hold what `copies` processes load before a GPU run (each loads the
    whole teacher and builds the whole student on the host, in fp32)."""
    need = est.whole_models * copies
    if need > available:
        raise UserError(f"prune-distill loads the whole teacher and student in fp32 on the host in every process "
                        f"before moving them to the GPU: {times(copies)}{size(need // copies)}; this machine has "
                        f"{size(available)} available: start fewer processes here or use a machine with more memory "
                        f"(docs/prune.md, Memory)")


def times(copies: int) -> str:
    return f"{copies} processes x " if copies > 1 else ""


def gib(n: int) -> str:
    return f"{n / GiB:.1f}"


def size(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / (1 << 20):.0f} MiB"


def per_token_layer(cfg: ModelConfig, shape: Shape, autocast: bool) -> int:
    """Bytes one student layer saves for the backward, per token."""
    C, I, arch = shape.hidden_size, shape.intermediate_size, cfg.arch
    q, kv = shape.num_heads * cfg.head_dim, shape.num_kv_heads * cfg.head_dim
    act = 2 if autocast else 4
    norms = len(arch.norms.names()) * 4 * C  # each hidden-wide RMSNorm's fp32 input (Llama 2, Gemma 4)
    qk_norms = 4 * (q + kv) if arch.qk_norm else 0  # q and k before their norms
    reads_x = len(arch.linears) - 2  # the Linears that read the normed x: all but o_proj and down_proj
    linear_inputs = (reads_x if autocast else 2) * act * C  # autocast casts the normed x once per Linear
    attention = act * (2 * q + 2 * kv + q)  # rotated q, k; v; the output (o_proj's input counted once more)
    mlp = 4 * act * I  # gate, silu(gate), up, product
    return norms + qk_norms + linear_inputs + attention + mlp


def outer_params(cfg: ModelConfig, shape: Shape) -> int:
    """Parameters outside the blocks: embedding, lm_head unless tied, final norm."""
    return cfg.vocab_size * shape.hidden_size * (1 if cfg.tie_word_embeddings else 2) + shape.hidden_size


def gathered_bytes(cfg: ModelConfig, shape: Shape, teacher_bytes: int) -> int:
    """FSDP's whole units at a time: both models' outer units and two blocks of each (the student's with grads)."""
    full = Shape.of(cfg)
    block = (param_count(cfg, shape) - outer_params(cfg, shape)) // shape.num_layers
    teacher_block = (param_count(cfg, full) - outer_params(cfg, full)) // full.num_layers
    return 8 * (outer_params(cfg, shape) + 2 * block) + teacher_bytes * (outer_params(cfg, full) + 2 * teacher_block)


def estimate(cfg: ModelConfig, shape: Shape, dcfg: DistillConfig | None, pcfg: PruneConfig,
             teacher_bytes: int = 4, autocast: bool = False, processes: int = 1, sharded: bool = False,
             on_host: bool = True) -> MemoryEstimate:
    """Memory of one process of prune-distill from the teacher's config, the student's shape and the run's
    settings; across `processes` (DDP) each holds both models, its slice of the micro-batch and DDP's
    gradient buckets (a second fp32 copy of the gradients); sharded (FSDP), 1/processes of the models and
    what is gathered whole; on_host: the process runs where it loads the models (no GPU)."""
    teacher_params, student_params = param_count(cfg, Shape.of(cfg)), param_count(cfg, shape)
    V = cfg.vocab_size
    if dcfg is None:  # prune only: both models in fp32 and one no-grad calibration batch
        tokens = CALIB_BATCH * pcfg.calib_seq_len
        return MemoryEstimate(teacher_params, teacher_bytes, student_params, 4,
                              tokens * 4 * (cfg.hidden_size * 4 + cfg.intermediate_size * 3), tokens * 4 * V * 2,
                              tokens, training=False)
    if dcfg.hidden_weight:  # the trained projection of the student's hidden states onto the teacher's
        student_params += shape.hidden_size * cfg.hidden_size
    tokens = dcfg.batch_size // processes * dcfg.seq_len
    act = 2 if autocast else 4
    activations = tokens * (shape.num_layers + 1) * per_token_layer(cfg, shape, autocast)
    logits = tokens * V * (LOGIT_COPIES * 4 + 2 * act)
    if sharded:
        return MemoryEstimate(teacher_params, teacher_bytes, student_params, ADAMW_FP32 / processes + (2 if autocast else 0),
                              activations, logits, tokens, training=True, shards=processes,
                              gathered=gathered_bytes(cfg, shape, teacher_bytes), loads_on_host=on_host)
    per_param = ADAMW_FP32 + (2 if autocast else 0) + (DDP_BUCKETS if processes > 1 else 0)
    return MemoryEstimate(teacher_params, teacher_bytes, student_params, per_param, activations, logits, tokens,
                          training=True, ddp=processes > 1)
