"""Fused int4 MoE kernel against reference.fused_moe_int4 (interpreter on CPU); the reference against per-token matmuls."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.quant.packing import pack, pack_zero_points
from tests.kernels.conftest import cuda_only
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.fused_moe")


def stacked(g, experts, out_features, in_features, group, symmetric, dtype):
    """(packed [E, O, I/8], scale [E, O, I/g], zero [E, O/8, I/g] or None): E random int4 weights."""
    packed = torch.stack([pack(torch.randint(0, 16, (out_features, in_features), generator=g), 4) for _ in range(experts)])
    scale = (torch.rand(experts, out_features, in_features // group, generator=g) * 0.1 + 0.01).to(dtype)
    zero = None if symmetric else torch.stack([
        pack_zero_points(torch.randint(0, 16, (out_features, in_features // group), generator=g), 4) for _ in range(experts)])
    return packed, scale, zero


def operands(tokens=5, hidden=64, width=32, experts=4, top_k=2, group=32, symmetric=False, dtype=torch.float32,
             device="cpu", seed=0):
    """x [T, C], gate_up, down, topk_ids [T, K], topk_weights [T, K]; the last expert is chosen by no token."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    gate_up = stacked(g, experts, 2 * width, hidden, group, symmetric, dtype)
    down = stacked(g, experts, hidden, width, group, symmetric, dtype)
    ids = torch.stack([torch.randperm(experts - 1, generator=g)[:top_k] for _ in range(tokens)]).int()  # [T, K]
    weights = torch.rand(tokens, top_k, generator=g).softmax(-1)  # [T, K] fp32
    to = lambda t: t if t is None else t.to(device)  # noqa: E731
    return to(x), tuple(map(to, gate_up)), tuple(map(to, down)), ids.to(device), weights.to(device)


def test_reference_matches_per_token_matmuls():
    x, gate_up, down, ids, weights = operands(tokens=3)
    for t in range(3):
        expected = 0
        for e, w in zip(ids[t].tolist(), weights[t].tolist()):
            gate, up = reference.dequant_matmul(x[t:t + 1], gate_up[0][e], gate_up[1][e], gate_up[2][e], 4).chunk(2, -1)
            expected = expected + w * reference.dequant_matmul(torch.nn.functional.silu(gate) * up, down[0][e], down[1][e], down[2][e], 4)
        assert_matches(reference.fused_moe_int4(x, gate_up, down, ids, weights)[t:t + 1], expected)


@pytest.mark.parametrize("symmetric", [True, False])
# T*K never a multiple of 16; 70 x 2 = 140 slots >= 32 per expert: BLOCK_M 64
@pytest.mark.parametrize("tokens,top_k,group,width", [(5, 2, 32, 32), (1, 1, 32, 32), (21, 2, 64, 64), (9, 3, 16, 48), (70, 2, 32, 32)])
def test_matches_reference(tokens, top_k, group, width, symmetric, device):
    x, gate_up, down, ids, weights = operands(tokens, 64, width, 4, top_k, group, symmetric, device=device)
    assert_matches(kernel.fused_moe_int4(x, gate_up, down, ids, weights), reference.fused_moe_int4(x, gate_up, down, ids, weights))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, device):
    x, gate_up, down, ids, weights = operands(tokens=7, dtype=dtype, device=device)
    assert_matches(kernel.fused_moe_int4(x, gate_up, down, ids, weights), reference.fused_moe_int4(x, gate_up, down, ids, weights))


def test_unchosen_expert_is_never_read(device):
    x, gate_up, down, ids, weights = operands(device=device)
    gate_up[1][-1], down[1][-1] = float("nan"), float("nan")  # expert E-1, which no token chose
    y = kernel.fused_moe_int4(x, gate_up, down, ids, weights)
    assert y.isfinite().all()
    assert_matches(y, reference.fused_moe_int4(x, gate_up, down, ids, weights))


def test_align_groups_slots_by_expert_in_padded_blocks():
    ids = torch.tensor([[2, 0], [0, 2], [2, 3]])  # slots 0..5; expert 1 unchosen
    slots, block_expert = kernel.align(ids, 4, 4)
    assert block_expert.tolist() == [0, 2, 3]
    assert slots.tolist() == [1, 2, 6, 6, 0, 3, 4, 6, 5, 6, 6, 6]  # 6 = T*K pads each expert's run


@pytest.mark.parametrize("change,message", [
    (dict(x=torch.ones(5, 64, dtype=torch.int32)), "x must be"),
    (dict(ids=torch.zeros(4, 2, dtype=torch.int32)), "topk_ids must be"),
    (dict(ids=torch.full((5, 2), 4, dtype=torch.int32)), r"topk_ids must lie in \[0, 4\)"),
    (dict(weights=torch.ones(5, 2, dtype=torch.float16)), "topk_weights must be"),
    (dict(gate_up=(torch.zeros(4, 64, 7, dtype=torch.int32), None, None)), "gate_up packed must have shape"),
    (dict(down=(None, torch.ones(3, 64, 1), None)), "down scale must be"),
    (dict(down=(None, torch.ones(4, 64, 4), None)), "group size"),
])
def test_rejects_bad_inputs(change, message):
    x, gate_up, down, ids, weights = operands()
    merge = lambda given, new: tuple(n if n is not None else old for old, n in zip(given, new))  # noqa: E731
    args = dict(x=x, gate_up=gate_up, down=down, ids=ids, weights=weights) | change
    args["gate_up"], args["down"] = merge(gate_up, args["gate_up"]), merge(down, args["down"])
    with pytest.raises(ValueError, match=message):
        kernel.fused_moe_int4(args["x"], args["gate_up"], args["down"], args["ids"], args["weights"])


@pytest.mark.cuda
@cuda_only
def test_qwen3_moe_shape_on_gpu():  # Qwen3-30B-A3B's experts: C 2048, I 768, 128 experts, top 8
    x, gate_up, down, ids, weights = operands(200, 2048, 768, 128, 8, 128, False, torch.bfloat16, "cuda")
    for tokens in (1, 16, 200):  # decode, a small batch, a prefill
        args = x[:tokens], gate_up, down, ids[:tokens], weights[:tokens]
        assert_matches(kernel.fused_moe_int4(*args), reference.fused_moe_int4(*args))
