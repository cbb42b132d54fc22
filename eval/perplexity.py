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

from compress.calib import compute_device, on_device
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


@torch.no_grad()
def perplexity(model, tokens: torch.Tensor, cfg: PerplexityConfig, desc: str = "perplexity") -> float:
    """exp of the mean next-token NLL of ``model`` over the windows of ``tokens``, on a GPU when there is one."""
    wins = windows(tokens, cfg)
    device = compute_device()
    nll, count = 0.0, 0
    with on_device(model, device):
        for batch in tqdm(wins.split(cfg.batch_size), desc=desc, unit="window"):
            batch = batch.to(device)
            logits = model(batch)[:, :-1].float()  # [B, T-1, V]
            nll += F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten(), reduction="sum").item()
            count += batch[:, 1:].numel()
    return math.exp(nll / count)
