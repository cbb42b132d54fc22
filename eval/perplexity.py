"""WikiText-2 perplexity, the canonical protocol.

The whole of wiki.test.raw is one string, tokenized once (no BOS), cut into non-overlapping
windows of ``seq_len`` tokens (a short last window is dropped, as in llm-awq and GPTQ); the
result is exp(mean NLL) over every predicted token (seq_len - 1 per window).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from compress.calib import COMPUTE_DTYPE, blocks, compute_device, embed, on_device
from compress.model import lazy
from compress.data import data_file
from compress.errors import UserError

WIKITEXT = "wikitext2/wiki.test.raw"


@dataclass
class PerplexityConfig:
    seq_len: int = 2048
    limit_tokens: int | None = None  # evaluate only the first N tokens (whole windows)
    batch_size: int = 1

    def __post_init__(self):
        if self.seq_len < 2:
            raise UserError(f"--seq-len must be at least 2, got {self.seq_len}")
        if self.limit_tokens is not None and self.limit_tokens < self.seq_len:
            raise UserError(f"--limit-tokens {self.limit_tokens} is shorter than one window (--seq-len {self.seq_len})")


def wikitext_tokens(tokenizer, path: Path | None = None) -> torch.Tensor:
    text = (path or data_file(WIKITEXT)).read_text(encoding="utf-8")
    return torch.tensor(tokenizer(text, add_special_tokens=False).input_ids)


def windows(tokens: torch.Tensor, cfg: PerplexityConfig) -> torch.Tensor:
    """[N] token ids -> [W, seq_len] non-overlapping windows."""
    if cfg.limit_tokens is not None:
        tokens = tokens[: cfg.limit_tokens]
    n = tokens.numel() // cfg.seq_len
    if n == 0:
        raise UserError(f"the text has {tokens.numel()} tokens, fewer than one window of {cfg.seq_len}")
    return tokens[: n * cfg.seq_len].view(n, cfg.seq_len)


ACTIVATION_BYTES = 2**30  # a lazy model's windows go through the blocks in groups whose activations fit in this


@torch.no_grad()
def perplexity(model, tokens: torch.Tensor, cfg: PerplexityConfig, desc: str = "perplexity") -> float:
    """exp of the mean next-token NLL of ``model`` over the windows of ``tokens``, on a GPU when there is one.

    A lazy model (compress.model.lazy) is run a block at a time in fp32: every window of a group goes
    through block i before block i + 1 is read, so memory holds one block, not the model."""
    wins = windows(tokens, cfg)
    device = compute_device()
    if lazy.is_lazy(model):
        return math.exp(streamed_nll(model, wins, device, desc) / (wins.shape[0] * (wins.shape[1] - 1)))
    nll, count = 0.0, 0
    with on_device(model, device):
        for batch in tqdm(wins.split(cfg.batch_size), desc=desc, unit="window"):
            batch = batch.to(device)
            nll += window_nll(model(batch), batch)
            count += batch[:, 1:].numel()
    return math.exp(nll / count)


def window_nll(logits: torch.Tensor, batch: torch.Tensor) -> float:
    """Summed next-token NLL of ``batch`` [B, T] under ``logits`` [B, T, V]."""
    logits = logits[:, :-1].float()  # [B, T-1, V]
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()


def streamed_nll(model, wins: torch.Tensor, device: torch.device, desc: str) -> float:
    group = max(1, ACTIVATION_BYTES // (wins.shape[1] * model.cfg.hidden_size * 4))
    positions = torch.arange(wins.shape[1], device=device)[None]  # [1, T]
    head = ["model.norm", "model.embed_tokens" if model.cfg.tie_word_embeddings else "lm_head"]
    nll = 0.0
    bar = tqdm(total=len(wins) * (model.cfg.num_layers + 1), desc=desc, unit="block")
    for chunk in wins.split(group):
        x = embed(model, chunk, device)  # [W, T, C] fp32
        for _, block in blocks(model, device):
            model.prepare(positions, x.dtype)
            x = torch.cat([block(row) for row in x.split(1)])  # a window at a time: the matmuls of a whole-model pass
            bar.update(len(chunk))
        for part in head:
            lazy.materialize(model, part, COMPUTE_DTYPE, device)
        for row, window in zip(x.split(1), chunk.split(1)):
            window = window.to(device)
            nll += window_nll(model.logits(model.model.norm(row)), window)
        bar.update(len(chunk))
        for part in head:
            lazy.release(model, part)
    bar.close()
    return nll
