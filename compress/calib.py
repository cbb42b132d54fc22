"""Calibration: text -> token batches, and block-by-block activation capture.

The searches see a model one decoder block at a time: embeddings run once, then each block
gets its inputs, is searched and quantized, and its *quantized* outputs become the next
block's inputs. This is the only module that moves blocks between devices, so only one block
(plus its activations) needs to sit on the compute device at a time.
"""

import json
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from compress.data import data_file
from compress.errors import UserError
from compress.model import lazy

C4 = "c4/c4_validation_2k.jsonl"


KINDS = "give a .jsonl (one {\"text\": ...} object a line), .txt, .parquet or a saved datasets directory"


def read_texts(path: str | None) -> list[str]:
    """Documents from .jsonl ("text" field), .txt (blank-line separated), or a local datasets dir/parquet."""
    if path is not None and not path.strip():
        raise UserError(f"the calibration data path is empty; {KINDS}")
    p = Path(path).expanduser() if path else data_file(C4)
    if not p.exists():
        raise UserError(f"calibration data {p} not found; {KINDS}")
    if p.suffix in (".jsonl", ".txt"):
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError) as e:
            raise UserError(f"calibration data {p} is not a UTF-8 text file ({e}); {KINDS}") from None
        return jsonl_texts(p, text) if p.suffix == ".jsonl" else [t for t in text.split("\n\n") if t.strip()]
    if p.is_file() and p.suffix != ".parquet":
        raise UserError(f"calibration data {p}: unknown file type '{p.suffix}'; {KINDS}")
    import datasets

    try:
        ds = datasets.load_dataset("parquet", data_files=str(p), split="train") if p.suffix == ".parquet" else datasets.load_from_disk(str(p))
    except FileNotFoundError as e:
        raise UserError(f"calibration data {p} is not a saved datasets directory ({e}); {KINDS}") from None
    if isinstance(ds, datasets.DatasetDict):
        ds = ds[next(iter(ds))]
    if "text" not in ds.column_names:
        raise UserError(f"calibration dataset {p} has no 'text' column (columns: {', '.join(ds.column_names)})")
    return check_strings(p, list(ds["text"]))


def jsonl_texts(p: Path, text: str) -> list[str]:
    """The "text" of every non-blank line; a line that is not a JSON object with a string "text" is an error naming it."""
    texts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{p}:{n}: not JSON ({e.msg}); {KINDS}") from None
        if not isinstance(record, dict) or "text" not in record:
            raise UserError(f"{p}:{n}: no \"text\" field; each line must be a JSON object like {{\"text\": \"...\"}}")
        if not isinstance(record["text"], str):
            raise UserError(f"{p}:{n}: \"text\" is {type(record['text']).__name__}, not a string")
        texts.append(record["text"])
    return texts


def check_strings(p: Path, texts: list) -> list[str]:
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise UserError(f"{p}: the 'text' of row {bad} is {type(texts[bad]).__name__}, not a string")
    return texts


def calibration_tokens(tokenizer, cfg) -> torch.Tensor:
    """[samples, seq_len] token ids: shuffled documents (seeded), concatenated, cut into rows."""
    texts = read_texts(cfg.calib_data)
    random.Random(cfg.seed).shuffle(texts)
    need = cfg.calib_samples * cfg.calib_seq_len
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer(t, add_special_tokens=False).input_ids)
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise UserError(
            f"calibration text has {len(ids)} tokens, fewer than --calib-samples {cfg.calib_samples} "
            f"x --calib-seq-len {cfg.calib_seq_len} = {need}; give more text or ask for fewer samples"
        )
    return torch.tensor(ids[:need]).view(cfg.calib_samples, cfg.calib_seq_len)


def compute_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextmanager
def on_device(module: nn.Module, device: torch.device):
    """Run ``module`` on ``device`` for the duration of the block, then put it back."""
    home = next(module.parameters()).device
    module.to(device)
    try:
        yield module
    finally:
        module.to(home)


BlockDone = Callable[[int, nn.Module], None]  # (index, finished block): e.g. write it out
COMPUTE_DTYPE = torch.float32  # searches, GPTQ and perplexity run in fp32 whatever the checkpoint stores


def blocks(model, device: torch.device, done: BlockDone | None = None) -> Iterator[tuple[int, nn.Module]]:
    """(i, block) for every decoder block, on ``device``. A lazy model's block is read from its checkpoint
    (as fp32) when its turn comes and released after ``done(i, block)``: one block is in memory at a time."""
    for i, block in enumerate(model.model.layers):
        if lazy.is_lazy(block):
            lazy.materialize(model, f"model.layers.{i}", COMPUTE_DTYPE, device)
            yield i, block
            if done is not None:
                done(i, block)
            lazy.release(model, f"model.layers.{i}")
            continue
        with on_device(block, device):
            yield i, block
        if done is not None:
            done(i, block)


@torch.no_grad()
def embed(model, tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Embeddings of ``tokens`` [N, T] -> [N, T, C] on ``device``; a lazy model's table is read as stored, then let go."""
    emb = model.model.embed_tokens
    if not lazy.is_lazy(emb):
        with on_device(emb, device):
            return model.embed(tokens.to(device))
    weight = model.reader("model.embed_tokens", emb)["weight"]  # [V, C] as stored
    return model.embed(tokens, weight).to(device, COMPUTE_DTYPE)


def block_inputs(model, tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Embeddings of the calibration tokens [N, T, C]: the first block's input."""
    return embed(model, tokens, device)


@torch.no_grad()
def run_block(block: nn.Module, x: torch.Tensor, batch: int = 16) -> torch.Tensor:
    """x [N, T, C] -> block(x) [N, T, C], ``batch`` sequences at a time."""
    return torch.cat([block(chunk) for chunk in x.split(batch)])


class InputRecorder:
    """Hooks on named sub-modules: mean |input| per channel over every token, and kept rows.

    ``keep`` [N] bool selects the sequences whose inputs are kept whole (for searches that
    need whole sequences, like attention); ``tokens`` [K] indexes flattened tokens of every
    input to keep as a per-token sample; ``gram``: also E[x x^T] over every token.
    """

    def __init__(self, block: nn.Module, names: list[str], keep: torch.Tensor, tokens: torch.Tensor, gram: bool = False):
        self.abs_sum: dict[str, torch.Tensor] = {}
        self.gram_sum: dict[str, torch.Tensor] | None = {} if gram else None
        self.count = 0
        self.kept: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self.sampled: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self.keep, self.tokens, self.offset = keep, tokens, 0
        self.handles = [block.get_submodule(n).register_forward_hook(self._hook(n)) for n in names]

    def _hook(self, name: str):
        def hook(module, args, output):
            x = args[0]  # [B, T, C]
            flat = x.reshape(-1, x.shape[-1]).float()
            self.abs_sum[name] = self.abs_sum.get(name, 0) + flat.abs().sum(0)
            if self.gram_sum is not None:
                self.gram_sum[name] = self.gram_sum.get(name, 0) + flat.T @ flat  # [C, C]
            b = x.shape[0]
            self.kept[name].append(x[self.keep[self.offset : self.offset + b]])
            lo, hi = self.offset * x.shape[1], (self.offset + b) * x.shape[1]
            sel = self.tokens[(self.tokens >= lo) & (self.tokens < hi)] - lo
            self.sampled[name].append(flat[sel].to(x.dtype))

        return hook

    def step(self, batch: torch.Tensor) -> None:
        """Call after each batch of sequences has run through the block."""
        self.offset += batch.shape[0]
        self.count += batch.shape[0] * batch.shape[1]

    def close(self) -> dict:
        for h in self.handles:
            h.remove()
        names = list(self.kept)
        stats = {
            n: {
                "mean_abs": self.abs_sum[n] / self.count,  # [C]
                "sequences": torch.cat(self.kept[n]),  # [S, T, C]
                "tokens": torch.cat(self.sampled[n]),  # [K, C]
            }
            for n in names
        }
        for n, g in (self.gram_sum or {}).items():
            stats[n]["gram"] = g / self.count  # [C, C]
        return stats


@torch.no_grad()
def record_inputs(block: nn.Module, x: torch.Tensor, names: list[str], keep_seqs: int, keep_tokens: int, seed: int,
                  batch: int = 16, gram: bool = False) -> dict:
    """Run block on x [N, T, C] and return, per sub-module name, its input statistics (see InputRecorder)."""
    n, t = x.shape[:2]
    g = torch.Generator().manual_seed(seed)
    keep = torch.zeros(n, dtype=torch.bool)
    keep[torch.randperm(n, generator=g)[: min(keep_seqs, n)]] = True
    tokens = torch.randperm(n * t, generator=g)[: min(keep_tokens, n * t)].sort().values
    rec = InputRecorder(block, names, keep.to(x.device), tokens.to(x.device), gram)
    for chunk in x.split(batch):
        block(chunk)
        rec.step(chunk)
    return rec.close()


@torch.no_grad()
def record_absmax(block: nn.Module, x: torch.Tensor, names: list[str], batch: int = 16) -> dict[str, torch.Tensor]:
    """Run block on x [N, T, C]; per sub-module name, the max |input| per channel [C_in] (fp32)."""
    amax: dict[str, torch.Tensor] = {}

    def hook(name):
        def fn(module, args, output):
            m = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(0).float()  # [C_in]
            amax[name] = torch.maximum(amax[name], m) if name in amax else m

        return fn

    handles = [block.get_submodule(n).register_forward_hook(hook(n)) for n in names]
    try:
        for chunk in x.split(batch):
            block(chunk)
    finally:
        for h in handles:
            h.remove()
    return amax
