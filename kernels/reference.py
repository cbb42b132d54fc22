"""Plain-torch reference of every kernel: the test oracle, and the CPU path of the runtime.

Imports only torch. Layouts are those of ``compress.quant.packing`` (pack-quantized, dense
little-endian bit stream per row); this file decodes them on its own, written as bit planes
rather than word arithmetic, so that a test comparing the two checks the layout twice.
"""

import torch


def unpack_rows(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """[R, W] int32 -> [R, cols] int32 codes, reading the stream 32 codes (= `bits` words) at a time."""
    rows, width = packed.shape
    groups = -(-width // bits)
    words = torch.nn.functional.pad(packed, (0, groups * bits - width)).view(rows, groups, bits)
    shifts = torch.arange(32, device=packed.device, dtype=torch.int32)
    stream = (words[..., None] >> shifts) & 1  # [R, G, bits, 32]: bit k of word w
    stream = stream.reshape(rows, groups, 32, bits)  # 32 codes of `bits` stream bits each
    weights = (1 << torch.arange(bits, device=packed.device, dtype=torch.int32))
    codes = (stream * weights).sum(-1, dtype=torch.int32)  # [R, G, 32]
    return codes.reshape(rows, groups * 32)[:, :cols]


def dequantize_packed(
    packed: torch.Tensor,  # [O, ceil(I*bits/32)] int32
    scale: torch.Tensor,  # [O, I/g]
    zero_packed: torch.Tensor | None,  # [ceil(O*bits/32), I/g] int32, None = symmetric
    bits: int,
    in_features: int,
    unpack=unpack_rows,  # (packed [R, W], bits, cols) -> codes [R, cols]; packed_words.py passes its faster one
) -> torch.Tensor:
    """The weight [O, I] in scale's dtype: (q - z) * s per group."""
    out_features, groups = scale.shape
    q = unpack(packed, bits, in_features).view(out_features, groups, -1)  # [O, G, g]
    if zero_packed is None:
        z = torch.full_like(scale, 2 ** (bits - 1))
    else:
        z = unpack(zero_packed.t().contiguous(), bits, out_features).t().to(scale.dtype)  # [O, G]
    w = q.to(scale.dtype).sub_(z[..., None]).mul_(scale[..., None])  # (q - z) * s, in place
    return w.view(out_features, in_features)


def dequant_matmul(x, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None, unpack=unpack_rows):
    """y [..., O] = x [..., I] @ dequant(W).T (+ bias)."""
    w = dequantize_packed(packed, scale, zero_packed, bits, x.shape[-1], unpack).to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)


INT8_MAX = 127
FP8_MAX = 448.0  # largest finite float8_e4m3fn


INT_MM_MAX_ROWS_CPU = 4


def round_blocks_int8(x: torch.Tensor, block: int = 32, step: str = "fp32") -> torch.Tensor:
    """x [..., I] as int8 per block of ``block`` inputs would give it back: d * round(x * (127 / max |x|)), d = max |x|
    / 127 (``step`` "fp32"), that rounded to fp16 ("fp16": ggml's Q8_0 activations) or 1 / (127 / max |x|)
    ("reciprocal": ggml's Q8_K, block 256), in fp32 as the kernels compute it (x / d rounds differently at rare
    near-ties: a flaky 1-in-600 mismatch; so does ``127 / amax``, which torch computes as 127 times amax's
    reciprocal: a product of exactly 60.5 where the kernel's true division gave one just above)."""
    xb = x.float().unflatten(-1, (-1, block))  # [..., I/block, block]
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127) / torch.where(amax > 0, amax, 1), 0)  # a true division
    d = {"fp32": lambda: amax / 127, "fp16": lambda: (amax / 127).half().float(),
         "reciprocal": lambda: torch.where(inv > 0, 1 / torch.where(inv > 0, inv, 1), 0)}[step]()
    return (torch.round(xb * inv) * d).flatten(-2)


def int8_activation_matmul(x, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None):
    """dequant_matmul of x rounded to int8 per block of 32 inputs (kernels/nibble_q8_cpu.py), in fp64."""
    w = dequantize_packed(packed, scale.double(), zero_packed, bits, x.shape[-1])
    return torch.nn.functional.linear(round_blocks_int8(x).double(), w, None if bias is None else bias.double()).float()


def int8_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[M, K] int8 @ [K, N] int8 -> [M, N] int32, exact, through ``torch._int_mm``.

    On CPU ``_int_mm`` takes any shape (torch >= 2.4) but its time grows linearly in M from a
    high base (torch 2.13: 44 ms at M=64 for a 576 x 1536 weight, 12x an exact float64 matmul),
    so past INT_MM_MAX_ROWS_CPU rows (prefill, calibration) the same int32 result is computed in
    float64, which is exact: |sum| <= K * 127^2 is far below 2^53. On CUDA ``_int_mm`` needs
    M > 16 and K, N multiples of 8, so the operands are zero-padded to those sizes (exact) and the
    result cut.
    """
    if not a.is_cuda:
        if a.shape[0] > INT_MM_MAX_ROWS_CPU:
            return (a.double() @ b.double()).to(torch.int32)
        return torch._int_mm(a, b)
    m, k = a.shape
    n = b.shape[1]
    pad_m, pad_k, pad_n = max(17 - m, 0), -k % 8, -n % 8
    a = torch.nn.functional.pad(a, (0, pad_k, 0, pad_m))
    b = torch.nn.functional.pad(b, (0, pad_n, 0, pad_k))
    return torch._int_mm(a, b)[:m, :n]


def quantize_per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[M, I] float -> (q int8 [M, I], scale fp32 [M, 1]) with q = round(x / scale), scale = absmax / 127."""
    x = x.float()
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / INT8_MAX  # [M, 1]
    return torch.round(x / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def rounded_int8(x: torch.Tensor, group: int) -> torch.Tensor:
    """x [M, I] as rounded to int8 per token and block of ``group`` inputs (0: per token), in fp32: each code times
    its step."""
    xq, xs = quantize_per_token_int8(x.reshape(-1, group or x.shape[-1]))  # [M * I/G, G] int8, [M * I/G, 1]
    return (xq.float() * xs).view(x.shape)


def int8_outlier_matmul(
    x: torch.Tensor,  # [..., I] fp16 / bf16 / fp32
    weight: torch.Tensor,  # [O, I] int8, the outlier columns zero
    weight_scale: torch.Tensor,  # [O, 1] float: row r of the weight is weight[r] * weight_scale[r]
    outlier_idx: torch.Tensor,  # [k] int32 input dims kept in floating point (k may be 0)
    outlier_weight: torch.Tensor,  # [O, k] fp16: the weight's columns at outlier_idx
    bias: torch.Tensor | None = None,  # [O]
    act_group: int = 0,  # x's steps per token and block of this many inputs; 0: one per token
) -> torch.Tensor:
    """y [..., O] in x's dtype: LLM.int8 with static outlier dims.

    The outlier slice of x times ``outlier_weight`` runs in x's dtype; the rest of x (the
    outlier dims zeroed) is quantized per token to int8 (absmax), multiplied with the int8
    weight in int32 and rescaled by token scale x row scale. With ``act_group`` each block of
    that many inputs of a token takes its own step (absmax of the block / 127); x as rounded
    (each code times its block's step) then meets the int8 weight in one fp32 product.
    """
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])  # [M, I]
    idx = outlier_idx.long()
    rest = x2.index_fill(-1, idx, 0)  # [M, I]
    if act_group:
        xd = rounded_int8(rest, act_group)  # [M, I]
        y = (xd @ weight.float().t()) * weight_scale.float().t()  # [M, O]
    else:
        xq, xs = quantize_per_token_int8(rest)  # [M, I] int8, [M, 1]
        acc = int8_gemm(xq, weight.t())  # [M, O] int32
        y = acc.float() * xs * weight_scale.float().t()  # [M, O]
    return int8_epilogue(y, x2, idx, outlier_weight, bias, shape)


def int8_epilogue(y: torch.Tensor, x2: torch.Tensor, idx: torch.Tensor, outlier_weight: torch.Tensor,
                  bias: torch.Tensor | None, shape: torch.Size) -> torch.Tensor:
    """y [M, O] fp32, the int8 part's product, plus the outlier slice's (x2 [M, I] at idx) and the bias: [..., O]
    (``shape``'s leading dims) in x2's dtype."""
    if idx.numel():
        y = y + (x2[:, idx] @ outlier_weight.to(x2.dtype).t()).float()
    y = y.to(x2.dtype)
    if bias is not None:
        y = y + bias
    return y.view(*shape[:-1], -1)


def quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale, saturated to +-448, rounded to float8_e4m3fn (torch's round-to-nearest-even cast)."""
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def fp8_token_scale(x: torch.Tensor) -> torch.Tensor:
    """[..., I] float -> [..., 1] fp32 dynamic per-token e4m3 input scale: absmax / 448."""
    return x.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX


def fp8_matmul(
    x: torch.Tensor,  # [..., I] fp16 / bf16 / fp32
    weight: torch.Tensor,  # [O, I] float8_e4m3fn
    weight_scale: torch.Tensor,  # [O, 1] float: row r of the weight is weight[r] * weight_scale[r]
    bias: torch.Tensor | None = None,  # [O]
    input_scale: torch.Tensor | None = None,  # [1] static per-tensor scale; None = dynamic per token
) -> torch.Tensor:
    """y [..., O] in x's dtype: x quantized to e4m3 (per token absmax / 448, or ``input_scale``),
    the e4m3 product accumulated in fp32 (products of e4m3 values are exact in fp32), rescaled."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).float()  # [M, I]
    if input_scale is None:
        xs = fp8_token_scale(x2)  # [M, 1]
    else:
        xs = input_scale.float().reshape(1, 1)
    xq = quantize_fp8(x2, xs)  # [M, I] e4m3
    y = (xq.float() @ weight.float().t()) * xs * weight_scale.float().t()  # [M, O]
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.view(*shape[:-1], -1)


def paged_attention(
    q: torch.Tensor,  # [S, H, D] one query token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    block_tables: torch.Tensor,  # [S, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [S] int32, each >= 1
    scale: float | None = None,
    softcap: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """[S, H, D] in q's dtype: softmax(scores) v over each sequence's cached tokens (fp32 math), where
    scores = q k^T * scale, or softcap * tanh(q k^T * scale / softcap) with a soft-cap.

    Token t of sequence s is slot t % block_size of block block_tables[s, t // block_size];
    query head h reads KV head h // (H / KVH); a ``window`` keeps only a sequence's last ``window``
    tokens (n of them: tokens t >= n - window). The layout is specified in docs/kernels.md.
    """
    seqs, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    scale = dim**-0.5 if scale is None else scale
    out = torch.empty_like(q)
    for s, n in enumerate(context_lens.tolist()):
        blocks = block_tables[s, : -(-n // block_size)].long()
        first = max(0, n - window) if window is not None else 0
        k = k_cache[blocks].reshape(-1, kv_heads, dim)[first:n].float().repeat_interleave(heads // kv_heads, 1)  # [n', H, D]
        v = v_cache[blocks].reshape(-1, kv_heads, dim)[first:n].float().repeat_interleave(heads // kv_heads, 1)  # [n', H, D]
        scores = torch.einsum("hd,nhd->hn", q[s].float(), k) * scale  # [H, n']
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        out[s] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out


def fused_moe_int4(
    x: torch.Tensor,  # [T, C] fp16 / bf16 / fp32
    gate_up: tuple,  # (packed [E, 2I, C/8] int32, scale [E, 2I, C/g], zero [E, 2I/8, C/g] int32 | None): gate rows, then up
    down: tuple,  # (packed [E, C, I/8] int32, scale [E, C, I/g], zero [E, C/8, I/g] int32 | None)
    topk_ids: torch.Tensor,  # [T, K] int: the experts of each token
    topk_weights: torch.Tensor,  # [T, K] fp32: their routing weights
) -> torch.Tensor:
    """out [T, C] in x's dtype: out[t] = sum_k w[t, k] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, k].

    Each expert's weights are dequant_matmul's int4 layout, stacked over experts. fp32 math; the
    intermediate silu(gate) * up is rounded to x's dtype (as the kernel stores it); an expert no
    token chose is never read.
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, C]
    for e in topk_ids.unique().tolist():
        token, k = (topk_ids == e).nonzero(as_tuple=True)  # [n] each
        w13, w2 = (dequantize_packed(p[e], s[e], None if z is None else z[e], 4, p.shape[-1] * 8).to(x.dtype).float()
                   for p, s, z in (gate_up, down))  # [2I, C], [C, I]
        gate, up = (x[token].float() @ w13.t()).chunk(2, dim=-1)  # [n, I] each
        h = (torch.nn.functional.silu(gate) * up).to(x.dtype).float()  # [n, I]
        out.index_add_(0, token, (h @ w2.t()) * topk_weights[token, k, None].float())
    return out.to(x.dtype)
