"""The runtime's attention backend for ``Decoder``: write each step's K/V into its cache slots, then
attend per sequence over the sequence's blocks.

The step's tokens arrive flattened as one [1, N] batch. Every new token of a sequence with at most
DECODE_ROWS of them (a decode, a speculative verification of a few draft tokens, a short prompt) is
a row of one paged decode-attention call, over the cache up to and including its own position
(its K/V is written first); sequences with more (a prompt, a prompt chunk, a recompute after
preemption) each attend causally over their cached prefix plus their new tokens.
KV layout (docs/kernels.md): k/v cache [num_blocks, block_size, KVH, D]; token t of a sequence is
slot t % block_size of block block_table[t // block_size].
"""

from dataclasses import dataclass

import torch

from compress import kernels
from compress.kernels import paged_attention_cpu, rope_cpu
from compress.model.attention import AttentionSpec, attend, window_mask
from compress.model.rope import apply_rope

DECODE_ROWS = 16  # beyond this many new tokens a sequence's rows cost more gathered than as one causal SDPA
GROUP_SLACK = 1.25  # CPU decode: a group's KV padded to its longest row may be this much more than its real KV


@dataclass
class DecodeGroup:
    """CPU decode rows of similar context, attended in one SDPA over their gathered blocks."""

    idx: torch.Tensor  # [G] long: positions among the decode rows
    tables: torch.Tensor  # [G, MB] long: their block tables, cut to the group's longest
    mask: torch.Tensor  # [G, 1, 1, MB * block_size] bool: keys each row may see


def group_by_context(blocks: list[int]) -> list[list[int]]:
    """Indices of ``blocks`` (blocks each row reads) in ascending order, cut into groups whose padded
    size (rows x the group's largest) stays within GROUP_SLACK of their real size: the gather and
    the attention then cost about what the real contexts need, not the batch's longest everywhere."""
    order = sorted(range(len(blocks)), key=blocks.__getitem__)
    groups, real = [[]], 0
    for i in order:
        if groups[-1] and blocks[i] * (len(groups[-1]) + 1) > GROUP_SLACK * (real + blocks[i]):
            groups.append([])
            real = 0
        groups[-1].append(i)
        real += blocks[i]
    return groups


@dataclass
class Prefill:
    start: int  # first row of the sequence's new tokens in the flat batch
    end: int
    context: int  # tokens attended to: cached prefix + new tokens
    blocks: torch.Tensor  # [ceil(context / block_size)] long, the sequence's blocks


@dataclass
class AttentionMetadata:
    positions: torch.Tensor  # [N] long: position of every new token in its sequence
    lengths: torch.Tensor  # [N] long: the length of every new token's sequence (longrope's choice), see build
    slots: torch.Tensor  # [N] long: cache slot (block * block_size + offset) of every new token
    decode_rows: torch.Tensor  # [Sd] long: rows attended as decodes (see DECODE_ROWS)
    decode_tables: torch.Tensor  # [Sd, MB] int32 block table of each row's sequence
    decode_lens: torch.Tensor  # [Sd] int32 context length of each row (its own token included)
    prefills: list[Prefill]

    @classmethod
    def build(cls, starts: list[int], lens: list[int], tables: list[list[int]], block_size: int, device,
              known: list[int] | None = None) -> "AttentionMetadata":
        """starts[i]: tokens of sequence i already cached; lens[i]: its new tokens; tables[i]: its blocks; known[i]: its
        tokens known at this step (default starts[i] + lens[i]), the length longrope chooses its factors by: every chunk
        of a prompt takes the whole prompt's, as one forward over the prompt does, whatever the token budget."""
        width = max(len(t) for t in tables)
        table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)  # [S, MB]
        lens_t, starts_t = torch.tensor(lens), torch.tensor(starts)
        lengths = torch.maximum(starts_t + lens_t, torch.tensor(known or [0] * len(lens)))  # [S]
        seq_of_row = torch.repeat_interleave(torch.arange(len(lens)), lens_t)  # [N]
        first_row = torch.cumsum(lens_t, 0) - lens_t  # [S]
        positions = starts_t[seq_of_row] + torch.arange(seq_of_row.numel()) - first_row[seq_of_row]  # [N]
        slots = table[seq_of_row, positions // block_size].long() * block_size + positions % block_size  # [N]
        decode = (lens_t[seq_of_row] <= DECODE_ROWS).nonzero().flatten()  # [Sd] rows
        decode_lens = (positions[decode] + 1).int()
        decode_width = -(-int(decode_lens.max()) // block_size) if decode.numel() else 0
        prefills = [
            Prefill(int(first_row[i]), int(first_row[i]) + n, starts[i] + n, table[i, : -(-(starts[i] + n) // block_size)].long())
            for i, n in enumerate(lens) if n > DECODE_ROWS
        ]
        return cls(
            positions.to(device), lengths[seq_of_row].to(device), slots.to(device), decode.to(device), table[seq_of_row[decode], :decode_width].to(device),
            decode_lens.to(device), [Prefill(p.start, p.end, p.context, p.blocks.to(device)) for p in prefills],
        )


class PagedAttention:
    """backend(layer, q [1, N, H, D], k, v [1, N, KVH, D]) -> [1, N, H, D] over the paged cache ``kv``.

    Each layer attends with its own window, the model's scale and soft-cap (``spec``, ``ModelConfig.attention``);
    decode rows go to the paged-attention kernel with them (Triton on CUDA, C on CPU where it builds)."""

    def __init__(self, kv: torch.Tensor, meta: AttentionMetadata, spec: AttentionSpec = AttentionSpec(), cpu_kernel: bool = True,
                 rope_kernel: bool = False):
        """cpu_kernel=False: CPU decodes take the torch path even where the C kernel builds; rope_kernel: q and k
        are rotated by ``kernels/rope_cpu.py`` where it takes them (the same numbers as torch's expression)."""
        self.kv = kv  # [2, L, num_blocks, block_size, KVH, D]
        self.meta, self.rope_kernel = meta, rope_kernel
        self.spec, self.scale, self.softcap = spec, spec.scale, spec.softcap
        use_kernel = kv.is_cuda or (cpu_kernel and paged_attention_cpu.supports(kv))
        # the CPU decode rows' groups for each window the layers use, built once per step (every layer reuses them)
        self.groups = {} if use_kernel or not meta.decode_rows.numel() else {
            w: self._decode_groups(kv.shape[3], w) for w in {spec.window(i) for i in range(kv.shape[1])}}
        # The C kernel's bounds depend on the tables and the pool, not the layer: checked here, once a step.
        self.c_kernel = use_kernel and not kv.is_cuda and meta.decode_rows.numel() > 0
        if self.c_kernel:
            paged_attention_cpu.check_bounds(kv[0, 0], meta.decode_tables, meta.decode_lens)

    def _decode_groups(self, block_size: int, window: int | None) -> list[DecodeGroup]:
        """The CPU decode rows' groups, their masks cut to ``window``."""
        lens = self.meta.decode_lens.long()  # [Sd]
        blocks = (-(-lens // block_size)).tolist()
        groups = []
        for members in group_by_context(blocks):
            idx = torch.tensor(members, device=lens.device)
            width = max(blocks[i] for i in members)
            mask = window_mask(lens[idx] - 1, width * block_size, window)  # [G, MB * bs]: each row's query is its last token
            groups.append(DecodeGroup(idx, self.meta.decode_tables[idx, :width].long(), mask[:, None, None]))
        return groups

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [1, N, H(kv), D] rotated by the step's tables cos, sin [1, N, D]."""
        if self.rope_kernel and rope_cpu.supports(x, cos):
            return rope_cpu.rope(x, cos, sin)
        return apply_rope(x, cos, sin)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = self.kv[0, layer], self.kv[1, layer]  # [NB, bs, KVH, D]
        kv_heads, dim = k_cache.shape[2:]
        k_cache.view(-1, kv_heads, dim).index_copy_(0, self.meta.slots, k[0])
        v_cache.view(-1, kv_heads, dim).index_copy_(0, self.meta.slots, v[0])
        out = torch.empty_like(q[0])  # [N, H, D]
        rows = self.meta.decode_rows
        if rows.numel():
            out.index_copy_(0, rows, self._decode(q[0, rows], k_cache, v_cache, self.spec.window(layer)))
        for p in self.meta.prefills:
            out[p.start:p.end] = self._prefill(q[0, p.start:p.end], k[0, p.start:p.end], v[0, p.start:p.end], p, k_cache, v_cache,
                                               self.spec.window(layer))
        return out[None]

    def _decode(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None) -> torch.Tensor:
        """[Sd, H, D]: one query per sequence over its cached tokens."""
        if self.c_kernel:
            return paged_attention_cpu.unchecked(q.contiguous(), k_cache, v_cache, self.meta.decode_tables, self.meta.decode_lens,
                                                 self.scale, self.softcap, window)
        if not self.groups:
            return kernels.paged_attention(q, k_cache, v_cache, self.meta.decode_tables, self.meta.decode_lens, self.scale,
                                           self.softcap, window)
        # CPU without the C kernel (no compiler, not fp32, or not chosen): per group of rows with similar context, one
        # batched call over the gathered blocks (padding masked out) instead of the reference's loop over sequences.
        out = torch.empty_like(q)  # [Sd, H, D]
        for g in self.groups[window]:
            k = k_cache[g.tables].flatten(1, 2).transpose(1, 2)  # [G, KVH, MB*bs, D]
            v = v_cache[g.tables].flatten(1, 2).transpose(1, 2)
            o = attend(q[g.idx, :, None], k, v, g.mask, False, self.scale, self.softcap)  # [G, H, 1, D]
            out[g.idx] = o[:, :, 0]
        return out

    def _prefill(self, q, k, v, p: Prefill, k_cache, v_cache, window: int | None) -> torch.Tensor:
        """[n, H, D]: n new tokens, causal over the cached prefix and themselves."""
        n, kv_heads, dim = k.shape
        if p.context > n:  # a cached prefix: read every key from the cache
            k = k_cache[p.blocks].reshape(-1, kv_heads, dim)[: p.context]  # [ctx, KVH, D]
            v = v_cache[p.blocks].reshape(-1, kv_heads, dim)[: p.context]
        causal = p.context == n and (window is None or n <= window)
        mask = None if causal else window_mask(torch.arange(p.context - n, p.context, device=q.device), p.context, window)  # [n, ctx]
        # 4-D operands: torch's CPU flash kernel takes only those (3-D ones fall back to the math
        # path, 2-3x slower here, materializing the whole score matrix).
        out = attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask, causal, self.scale,
                     self.softcap)  # [1, H, n, D]
        return out[0].transpose(0, 1)
