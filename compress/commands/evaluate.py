"""`compress eval`: run the requested tasks on each model, print a table, record the numbers, write a report."""

import time
from dataclasses import dataclass, field
from pathlib import Path

from compress import models
from compress.data import data_file
from compress.errors import UserError
from compress.manifest import record_quality

OWN_TASKS = ("wikitext", "mmlu")
BACKENDS = ("compress", "hf")


@dataclass
class EvalConfig:
    tasks: list[str] = field(default_factory=lambda: ["wikitext"])
    backend: str = "compress"
    num_fewshot: int = 0
    limit: int | None = None  # MMLU questions per subject (or examples per lm-eval task)
    seq_len: int = 2048  # wikitext windows
    limit_tokens: int | None = None  # wikitext: only the first N tokens
    batch_size: int = 1  # hf backend
    report: Path | None = None

    def __post_init__(self):
        if not self.tasks or any(not t for t in self.tasks):
            raise UserError("--tasks needs at least one task name, e.g. --tasks mmlu,wikitext")
        if self.backend not in BACKENDS:
            raise UserError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend}")
        if not 0 <= self.num_fewshot <= 5:
            raise UserError(f"--num-fewshot must be in 0..5 (MMLU has 5 dev questions per subject), got {self.num_fewshot}")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"--limit must be at least 1, got {self.limit}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.report is not None:
            self.check_report()

    def check_report(self) -> None:
        """--report replaces an earlier report, never a directory that holds something else."""
        from compress.outdir import check_writable

        if Path(self.report).name in ("", ".", ".."):
            raise UserError(f"--report '{self.report}' is not a directory name; give e.g. --report out/report")
        check_writable(self.report, "--report")
        if self.report.is_dir() and any(self.report.iterdir()) and not (self.report / "report.json").is_file():
            raise UserError(f"--report {self.report} is a directory that holds other files, not an earlier report; choose another")

    @property
    def other_tasks(self) -> list[str]:
        return [t for t in self.tasks if t not in OWN_TASKS]


def model_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def run_eval(names: list[str], cfg: EvalConfig) -> list[dict]:
    paths = [models.resolve(n) for n in names]  # every MODEL and task is checked before any work
    check_data(cfg)
    rows = [evaluate_one(name, path, cfg) for name, path in zip(names, paths)]
    print_table(rows)
    if cfg.report is not None:
        from compress.eval.report import write_report

        write_report(rows, cfg, cfg.report)
        print(f"report written to {cfg.report}/report.md")
    return rows


def check_data(cfg: EvalConfig) -> None:
    """Fail in one line, before any work, on a task whose data is missing or a task lm-eval does not know."""
    from compress.eval import harness

    if "wikitext" in cfg.tasks:
        from compress.eval.perplexity import WIKITEXT

        data_file(WIKITEXT)
    if "mmlu" in cfg.tasks:
        from compress.eval.mmlu import mmlu_dir

        mmlu_dir()
    harness.check_tasks(cfg.other_tasks)


def evaluate_one(name: str, path: Path, cfg: EvalConfig) -> dict:
    from compress.eval import harness

    row = {"model": name, "path": str(path), "bytes": model_bytes(path), "seconds": {}}
    if "wikitext" in cfg.tasks:
        start = time.perf_counter()
        row["wikitext_ppl"] = wikitext(name, path, cfg)
        row["seconds"]["wikitext"] = time.perf_counter() - start
    if "mmlu" in cfg.tasks or cfg.other_tasks:
        lm = harness.make_lm(cfg.backend, path, cfg.batch_size)
        if "mmlu" in cfg.tasks:
            start = time.perf_counter()
            row["mmlu"] = harness.run_mmlu(lm, cfg.num_fewshot, cfg.limit)
            row["seconds"]["mmlu"] = time.perf_counter() - start
            key = f"mmlu_{cfg.num_fewshot}shot_{cfg.backend}" + (f"_limit{cfg.limit}" if cfg.limit else "")
            groups = {g: round(r["acc"], 4) for g, r in row["mmlu"].items() if g != "subjects"}
            record_quality(path, key, groups)
        if cfg.other_tasks:
            row["tasks"] = harness.run_tasks(lm, cfg.other_tasks, cfg.num_fewshot or None, cfg.limit)
            for task, metrics in row["tasks"].items():
                record_quality(path, f"{task}_{cfg.backend}", metrics)
    return row


def wikitext(name: str, path: Path, cfg: EvalConfig) -> float:
    from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens

    pcfg = PerplexityConfig(seq_len=cfg.seq_len, limit_tokens=cfg.limit_tokens)
    model = models.open_model(path)
    check_memory(model, cfg.seq_len, name)
    ppl = perplexity(model, wikitext_tokens(models.load_tokenizer(path)), pcfg, desc=f"wikitext {name}")
    record_quality(path, f"wikitext_ppl_seq{cfg.seq_len}" + (f"_first{cfg.limit_tokens}" if cfg.limit_tokens else ""),
                   round(ppl, 4))
    return ppl


def check_memory(model, seq_len: int, name: str) -> None:
    """Streamed perplexity holds one fp32 block, a group of windows' activations, the head and one window's logits."""
    import torch

    from compress.calib import compute_device
    from compress.eval.perplexity import ACTIVATION_BYTES
    from compress.model import memory

    head = "model.embed_tokens." if model.cfg.tie_word_embeddings else "lm_head."
    logits = 3 * seq_len * model.cfg.vocab_size * 4  # fp32 logits, their log-softmax and its gradient-free temporaries
    need = 2 * memory.block_bytes(model, torch.float32) + ACTIVATION_BYTES + memory.tensor_bytes(model, head, torch.float32) + logits
    memory.require(need, compute_device(), f"perplexity of {name}", "pass a shorter --seq-len, or run it on a machine with more memory")


def print_table(rows: list[dict]) -> None:
    from compress.eval.report import markdown_table

    print(markdown_table(rows))
