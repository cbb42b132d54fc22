"""Linears the user keeps unquantized (`compress quantize --ignore`), named as llm-compressor's ``ignore`` names them.

A pattern is a Linear's full name (``model.layers.0.mlp.down_proj``) or ``re:`` and a regular expression matched from
the start of the name (``re:.*layers\\.(0|29)\\.mlp\\.``), the two forms compressed-tensors' ``ignore`` list takes, so
the list written to config.json is what transformers and vLLM read. The Linears vLLM runs as one fused layer of one
type are left out together or not at all: an attention's q/k/v, an MLP's gate/up (a dense MLP's, a shared
expert's), and every Linear of every expert of a MoE layer (its fused-MoE kernel).

Leaving a Linear out means taking it from its block's ``linears``, the list every method swaps (swap.py), so the
methods need no case of their own: AWQ folds a group's scale into an ignored Linear unrounded, as into a router.
"""

import re

from compress.errors import UserError
from compress.model.decoder import Decoder

ALWAYS = ("lm_head",)  # unquantized whatever the patterns say (export.unquantized)
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}  # vLLM's joins, by the fused module's name
EXPERTS = ".experts."  # a MoE layer's experts (Mixtral's block_sparse_moe.experts.N.w1 too): one fused layer


def fused_set(name: str) -> str:
    """The name of the fused layer vLLM runs ``name`` in (``...self_attn.qkv_proj``, ``...mlp.experts``), the name
    itself where it runs alone."""
    if EXPERTS in name:
        return name.split(EXPERTS)[0] + EXPERTS.rstrip(".")
    parent, _, kind = name.rpartition(".")
    return f"{parent}.{FUSED[kind]}" if kind in FUSED else name


def awq_skips(names: list[str]) -> list[str]:
    """AutoAWQ's ``modules_to_not_convert`` for ``names``: each name, then the fused layers vLLM runs them in, because
    vLLM skips a layer when an entry is a substring of its fused name (``...qkv_proj``) and transformers when an entry
    matches its own module's name."""
    return [*names, *sorted({fused_set(n) for n in names} - set(names))]


def matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name


def check_patterns(patterns: list[str]) -> None:
    """A ``re:`` pattern that does not compile fails before any work."""
    for p in patterns:
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as e:
                raise UserError(f"--ignore {p}: not a regular expression ({e})") from None


def every_linear(model: Decoder) -> list[str]:
    """Full names of every decoder layer's Linears."""
    return [f"model.layers.{i}.{n}" for i in range(model.cfg.num_layers) for n in model.cfg.layer_linears(i)]


def matched(model: Decoder, patterns: list[str]) -> set[str]:
    """Full names of the decoder Linears any of ``patterns`` matches."""
    return {n for n in every_linear(model) if any(matches(p, n) for p in patterns)}


def ignored_names(model: Decoder, patterns: list[str]) -> set[str]:
    """``matched``, where a pattern matching no Linear, or a fused set matched in part, is refused."""
    every = every_linear(model)
    for p in patterns:
        if p not in ALWAYS and not any(matches(p, n) for n in every):
            raise UserError(f"--ignore {p} matches no Linear of a decoder layer; names look like {every[-1]} "
                            "(or re:REGEX, matched from the start)")
    out = matched(model, patterns)
    sets: dict[str, list[str]] = {}
    for n in every:
        sets.setdefault(fused_set(n), []).append(n)
    for key in sorted({fused_set(n) for n in out}):
        members = sets[key]
        if not set(members) <= out:
            shown = f"{members[0]} ... {members[-1]}" if len(members) > 3 else ", ".join(members)
            raise UserError(f"--ignore leaves out part of {shown}: vLLM runs them as one fused layer of one type; "
                            "ignore all of them or none")
    return out


def leave_unquantized(model: Decoder, names: set[str]) -> None:
    """Take ``names`` from their blocks' ``linears`` so that no method replaces them."""
    for i, block in enumerate(model.model.layers):
        block.linears = tuple(n for n in block.linears if f"model.layers.{i}.{n}" not in names)


def left_out(model: Decoder, layer: int, block) -> list[str]:
    """Full names of layer ``layer``'s Linears that its block does not quantize."""
    return [f"model.layers.{layer}.{n}" for n in model.cfg.layer_linears(layer) if n not in block.linears]
