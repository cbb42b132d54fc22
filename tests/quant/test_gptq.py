"""GPTQ's rounding: nearest rounding when inputs are uncorrelated, a smaller output error when they are not."""

import pytest
import torch

from compress.quant.gptq import cholesky_upper, feedback, gptq_codes, prepare
from compress.quant.primitives import IntSpec, grouped, qparams, quantize

SPEC = IntSpec(4, 16)


def correlated_inputs(n=4096, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(dim, dim, generator=g) / dim**0.5 + torch.eye(dim)
    return torch.randn(n, dim, generator=g) @ mix  # [n, dim], channels share most of their variance


def output_error(w, codes, scale, zero, x):
    """Mean squared error of x W^T when W is replaced by its rounding."""
    q = (grouped(codes.float(), SPEC.group_size) - zero[..., None].float()) * scale[..., None]
    return (x @ (w - q.reshape(w.shape)).T).pow(2).mean().item()


def test_uncorrelated_inputs_give_nearest_rounding():
    w = torch.randn(32, 64)
    scale, zero = qparams(w, SPEC)
    assert torch.equal(gptq_codes(w, torch.eye(64), scale, zero, SPEC), quantize(w, scale, zero, SPEC))


@pytest.mark.parametrize("bits", [3, 4])
def test_error_feedback_beats_nearest_on_correlated_inputs(bits):
    spec = IntSpec(bits, SPEC.group_size)
    w, x = torch.randn(48, 64, generator=torch.Generator().manual_seed(1)), correlated_inputs()
    scale, zero = qparams(w, spec)
    codes = gptq_codes(w, x.T @ x / x.shape[0], scale, zero, spec)
    assert codes.dtype == torch.uint8 and codes.max() <= spec.qmax
    nearest = quantize(w, scale, zero, spec)
    assert output_error(w, codes, scale, zero, x) < 0.75 * output_error(w, nearest, scale, zero, x)


def textbook_gptq(w, h, scale, zero, spec, damp=0.01):
    """GPTQ as the paper writes it, in fp64, one column at a time, largest input energy first: after each column,
    every later column moves by its error over U_ii times row i of U = chol(H^-1) (upper). The oracle."""
    perm = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    h = h.double()[perm][:, perm]
    h.diagonal().add_(damp * h.diagonal().mean())
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    s = scale.double().repeat_interleave(spec.group_size, 1)[:, perm]
    z = zero.double().repeat_interleave(spec.group_size, 1)[:, perm]
    w, q = w.double()[:, perm].clone(), torch.empty(w.shape, dtype=torch.double)
    for i in range(w.shape[1]):
        q[:, i] = torch.clamp(torch.round(w[:, i] / s[:, i]) + z[:, i], 0, spec.qmax)
        e = (w[:, i] - (q[:, i] - z[:, i]) * s[:, i]) / u[i, i]
        w[:, i + 1 :] -= e[:, None] * u[i, i + 1 :][None, :]
    codes = torch.empty_like(q)
    codes[:, perm] = q
    return codes.to(torch.uint8)


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_codes_are_the_textbook_algorithms_in_exact_arithmetic(bits, seed):
    """Other sums in another order (one Cholesky factor of H, blocks), the same codes as the paper's updates in fp64."""
    spec = IntSpec(bits, 32)
    g = torch.Generator().manual_seed(seed)
    x = correlated_inputs(2048, 128, seed) * (1 + 9 * (torch.rand(128, generator=g) < 0.05))  # a few loud inputs
    w = torch.randn(64, 128, generator=g)
    scale, zero = qparams(w, spec)
    h = x.T @ x / x.shape[0]
    assert torch.equal(gptq_codes(w, h, scale, zero, spec), textbook_gptq(w, h, scale, zero, spec))


def test_blocked_cholesky_is_the_cholesky_factor():
    x = torch.randn(700, 600, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = x.T @ x  # 600 = two blocks of 256 and a ragged one
    u = cholesky_upper(a.clone())
    assert torch.equal(u, u.triu())
    assert torch.allclose(u, torch.linalg.cholesky(a, upper=True), rtol=0, atol=1e-10 * u.abs().max().item())


def test_block_size_does_not_change_the_codes():
    w, x = torch.randn(16, 64), correlated_inputs(seed=2)
    scale, zero = qparams(w, SPEC)
    h = x.T @ x / x.shape[0]
    a, b = gptq_codes(w, h, scale, zero, SPEC, block=128), gptq_codes(w, h, scale, zero, SPEC, block=16)
    assert (a == b).float().mean() > 0.99  # the same algebra; float sums in another order may flip a tie


def test_inputs_that_are_always_zero_give_nearest_rounding():
    w = torch.randn(16, 64)
    scale, zero = qparams(w, SPEC)
    assert torch.equal(gptq_codes(w, torch.zeros(64, 64), scale, zero, SPEC), quantize(w, scale, zero, SPEC))


def test_act_order_rounds_the_loudest_inputs_first_on_the_original_grids():
    # Input energy rising with the column index: act-order is GPTQ over the columns in reverse order,
    # each column still on its own group's grid.
    w, x = torch.randn(16, 64), correlated_inputs(seed=3)
    x = x * (torch.linspace(1, 3, 64) / x.pow(2).mean(0)).sqrt()  # E[x_i^2] = 1 + 2i/63
    scale, zero = qparams(w, SPEC)
    h = x.T @ x / x.shape[0]
    ordered = gptq_codes(w, h, scale, zero, SPEC, act_order=True)
    reverse = gptq_codes(w.flip(1), h.flip(0, 1), scale.flip(1), zero.flip(1), SPEC, act_order=False).flip(1)
    assert torch.equal(ordered, reverse)
    assert not torch.equal(ordered, gptq_codes(w, h, scale, zero, SPEC, act_order=False))


def copied_feedback(h, order, damp=0.01):
    """``feedback`` as first written, with whole-matrix copies: the chunked, in-place one must give its bits."""
    back = order.flip(0)
    a = h[back[:, None], back].to(torch.float64)
    dead = torch.diagonal(a) == 0
    a[dead, dead] = 1
    a.diagonal().add_(damp * torch.diagonal(a).mean())
    u = torch.zeros_like(a)
    for k0 in range(0, a.shape[0], 256):
        k1 = k0 + 256
        rows = torch.addmm(a[k0:k1, k0:], u[:k0, k0:k1].T, u[:k0, k0:], alpha=-1)
        u[k0:k1, k0:k1] = torch.linalg.cholesky(rows[:, :256], upper=True)
        u[k0:k1, k1:] = torch.linalg.solve_triangular(u[k0:k1, k0:k1].mT, rows[:, 256:], upper=False)
    u /= torch.diagonal(u).clone()[:, None]
    return u.float().flip(0, 1)


def test_feedback_is_bit_for_bit_the_whole_matrix_computation():
    x = correlated_inputs(n=300, dim=600, seed=4)  # rank 300 of 600: the damping matters; 600 = ragged row blocks
    x[:, 7] = 0  # a dead input
    h = x.T @ x / x.shape[0]
    order = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    assert torch.equal(feedback(h, order), copied_feedback(h, order))


def test_prepared_feedback_gives_the_same_codes():
    w, x = torch.randn(16, 64), correlated_inputs(seed=5)
    scale, zero = qparams(w, SPEC)
    h = x.T @ x / x.shape[0]
    assert torch.equal(gptq_codes(w, h, scale, zero, SPEC, prepare(h)), gptq_codes(w, h, scale, zero, SPEC))
