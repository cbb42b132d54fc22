"""ModelRunner: owns the Decoder and the KV cache; runs one scheduled step as one flat token batch."""

import sys
from itertools import accumulate

import psutil
import torch

from compress.errors import UserError
from compress.model.decoder import Decoder
from compress.roofline import kv_bytes_per_token
from compress.runtime.attention import AttentionMetadata, PagedAttention
from compress.runtime.config import EngineConfig
from compress.runtime.cpu_kernels import choose
from compress.runtime.cpu_step import DecodeStep, eligible
from compress.runtime.fused_experts import fuse_experts
from compress.runtime.scheduler import ScheduledBatch


def kv_block_bytes(cfg, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one KV block (K and V of every layer) of a model with ModelConfig cfg."""
    return block_size * kv_bytes_per_token(cfg, dtype.itemsize)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


class ModelRunner:
    def __init__(self, model: Decoder, config: EngineConfig, max_model_len: int):
        self.config, self.device = config, torch.device(config.device)
        self.model = model.to(self.device).eval()
        self.cpu_kernels = choose(self.model, config) if self.device.type == "cpu" else None  # builds the C kernels now
        if self.cpu_kernels is not None:
            for line in self.cpu_kernels.lines():
                print(f"runtime: {line}", file=sys.stderr)
        self.fused_experts = fuse_experts(self.model)  # CUDA: int4 experts stacked for the fused MoE kernel
        if self.fused_experts:
            mib = sum(f.nbytes() for f in self.fused_experts) / 2**20
            print(f"runtime: {len(self.fused_experts)} MoE blocks run their routed int4 experts in the fused kernel "
                  f"({mib:.1f} MiB stacked, the experts' own buffers now views of it)", file=sys.stderr)
        cfg = model.cfg
        self.attention = cfg.attention()  # every layer's window, the scale and soft-cap: the same every step
        self.block_size = config.block_size
        self.num_blocks = self._pool_blocks(max_model_len)
        self.kv = torch.zeros(  # [2 (k, v), L, num_blocks, block_size, KVH, D]
            2, cfg.num_layers, self.num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=config.torch_dtype, device=self.device,
        )
        mib = self.kv.numel() * self.kv.element_size() / 2**20
        print(f"runtime: KV cache {self.num_blocks} blocks x {self.block_size} tokens ({mib:.1f} MiB)", file=sys.stderr)
        self.decode_step = DecodeStep(self.model, self.kv) if self.cpu_kernels is not None and eligible(self.model) else None
        if self.decode_step is not None:
            print("runtime: decode steps run every block in one C call where C is chosen for every op at the step's rows",
                  file=sys.stderr)

    def block_bytes(self) -> int:
        return kv_block_bytes(self.model.cfg, self.block_size, self.config.torch_dtype)

    def _pool_blocks(self, max_model_len: int) -> int:
        """Blocks that fit the byte budget, capped at what max_num_seqs full-length sequences could use."""
        budget = self.config.kv_cache_memory or int(free_memory(self.device) * self.config.kv_cache_fraction)
        blocks = budget // self.block_bytes()
        if blocks < 1:
            raise UserError(f"the KV cache budget of {budget} bytes is less than one block ({self.block_bytes()} bytes)")
        return min(blocks, self.config.max_num_seqs * -(-max_model_len // self.block_size))

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (fp32) at the batch.num_sample_rows(i) last tokens of every sequence that samples this step
        (the last token, after its draft tokens if any), in batch order [S, V], and at the rows of
        batch.prompt_logprob_rows(), concatenated in that order [R, V]."""
        self._copy_blocks(batch.copies)
        starts = [s.num_computed for s in batch.seqs]
        ids = [t for s, c, n in zip(batch.seqs, starts, batch.num_new_tokens) for t in s.token_ids[c:c + n]]
        meta = AttentionMetadata.build(starts, batch.num_new_tokens, [s.block_table for s in batch.seqs], self.block_size, self.device,
                                       [s.num_tokens for s in batch.seqs])
        ends = list(accumulate(batch.num_new_tokens))
        last_rows = [row for i, end in enumerate(ends) for row in range(end - batch.num_sample_rows(i), end)]
        prompt_rows = [ends[i] - batch.num_new_tokens[i] + (p - starts[i])
                       for i, first, n in batch.prompt_logprob_rows() for p in range(first, first + n)]
        cpu_kernel = self.cpu_kernels is not None and self.cpu_kernels.attention_c(len(meta.decode_rows))
        rope_kernel = self.cpu_kernels is not None and self.cpu_kernels.rope_c(len(ids))
        ids_t = torch.tensor([ids], device=self.device)  # [1, N]
        if self.decode_step is not None and self.decode_step.takes(meta, len(ids), cpu_kernel, rope_kernel):
            h = self.decode_step(ids_t, meta)  # [1, N, C]
        else:
            backend = PagedAttention(self.kv, meta, self.attention, cpu_kernel, rope_kernel)
            h = self.model.hidden(ids_t, meta.positions[None], backend, meta.lengths[None])  # [1, N, C]
        logits = self.model.logits(h[0, last_rows + prompt_rows]).float()  # [S + R, V]
        return logits[:len(last_rows)], logits[len(last_rows):]

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if copies:
            src, dst = (torch.tensor(c, device=self.device) for c in zip(*copies))
            self.kv[:, :, dst] = self.kv[:, :, src]
