"""A K-quant's scales taken apart again: values [N, 8] (a super-block's eight sub-block scales, or minus its mins,
as ``d * sc`` with d one fp16 number and sc 6-bit integers) -> unit [N] fp32 and k [N, 8] uint8 with unit * k equal
to every value exactly in fp32, or None where some super-block has no such pair. Imports only torch.

Why: a Q4_K file stores d, dmin and 6-bit sc, m per 32 weights (4.5 bits a weight); our readers hand the runtime
their fp32 products (``GgufLinear``), 64 bits per 32 weights (6 bits a weight), and a decode step reads those bytes.
Holding the integers and one unit per super-block again (4.75 bits, ``nibble_forms``) needs no change to any file.

How: each fp32 value is an integer times a power of two; written over the super-block's smallest power, the
values are integers S (at most 2^32 when they span 2^8, as 8-bit sc do) and their greatest common divisor g gives
unit = g * 2^E, k = S / g; k fits a byte when the values came as d * sc (then k = sc / gcd(sc)). Sign: a super-block
whose values are all <= 0 (minus the mins) takes a negative unit.
"""

import torch

SPAN = 32  # bits the integers S may take (int64 holds them and their products with 2^SPAN unit checks)


def factor(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """values [N, 8] fp32 -> (unit [N] fp32, k [N, 8] uint8) with unit[:, None] * k == values in fp32, or None."""
    sign = torch.where((values <= 0).all(1) & (values < 0).any(1), -1.0, 1.0)  # [N]
    v = values * sign[:, None]  # [N, 8], >= 0 where factorable
    if bool((v < 0).any()) or not bool(torch.isfinite(v).all()):
        return None
    mant, exp = torch.frexp(v.double())
    ints, shift = (mant * 2.0**24).long(), exp.long() - 24  # v = ints * 2^shift exactly (24-bit mantissas)
    nonzero = v > 0
    low = torch.where(nonzero, shift, torch.iinfo(torch.int64).max).amin(1, keepdim=True)  # [N, 1]
    up = torch.where(nonzero, shift - low, 0)
    if bool((up > SPAN - 24).any()):
        return None
    whole = ints << up  # [N, 8] integers in units of 2^low
    g = whole[:, 0]
    for j in range(1, whole.shape[1]):
        g = torch.gcd(g, whole[:, j])  # [N]
    k = whole // torch.where(g > 0, g, 1)[:, None]
    if bool((k > 255).any()):
        return None
    unit = torch.ldexp(g.double(), torch.where(g > 0, low[:, 0], 0).double()).float() * sign  # [N]
    k = k.to(torch.uint8)
    return (unit, k) if torch.equal(unit[:, None] * k.float(), values) else None


def factor_signed(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """values [N, S] fp32 of either sign (a Q6_K super-block's d * sc, sc int8) -> (unit [N] fp32, k [N, S] int8) with
    unit[:, None] * k == values in fp32, or None. The magnitudes are factored as ``factor``'s; a super-block whose k
    reach +128 takes the negative unit (Q6_K's largest sub-scale is -128 times d)."""
    parts = factor(values.abs())
    if parts is None:
        return None
    unit, k = parts[0], parts[1].to(torch.int16) * torch.where(values < 0, -1, 1)  # [N], [N, S]
    flip = (k > 127).any(1)  # [N]
    unit, k = torch.where(flip, -unit, unit), torch.where(flip[:, None], -k, k)
    if bool(((k > 127) | (k < -128)).any()):
        return None
    k = k.to(torch.int8)
    return (unit, k) if torch.equal(unit[:, None] * k.float(), values) else None
