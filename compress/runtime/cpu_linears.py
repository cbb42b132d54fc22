"""The CPU path's Linears: each Linear and int4/int3 PackedLinear swapped at engine start for one that
runs, per call, the kernel measured fastest at its row count (``kernel_choice``): our C GEMM, our panel
GEMM (``kernels/panel_cpu.py``: W packed per call, for many rows) or torch's.

Memory each holds:
- fp32 (``CpuLinear``): the Linear's own weight ``[O, I]``, which every kernel reads as it is
  (``kernels/linear_cpu.py``; the panel GEMM copies one panel at a time, 64 KiB a thread): nothing is
  held twice, and a tied lm_head shares the embedding's table.
- int4/int3 (``NibbleLinear``): the codes as nibbles plus an fp32 scale and offset per group, ~5 bits
  a weight at g64 (``kernels/nibble_linear_cpu.py``), never a dense copy. Its panel path dequantizes
  straight into the panel GEMM's panels, one at a time; its torch path dequantizes the weight into a
  ``Scratch`` buffer on every call (amortized where it wins: many rows) and runs torch's GEMM over it;
  one buffer serves every held Linear, as large as the largest dense weight among those whose plan
  runs torch at some row count, allocated at the first such call.
- int4 with int8 activations (``NibbleLinear(int8_activations=True)``, opt-in): the same nibbles; its C
  path rounds x to int8 per block of 32 inputs (``kernels/nibble_q8_cpu.py``). Where fp16 holds them exactly (a
  GGUF's Q4_0 and Q4_1) its scales and offsets are kept in fp16, and a Q4_0's offsets (-8 times the scales) not at
  all: 4.5 bits a weight at g32 instead of 6; a Q4_K's as its super-blocks' bytes and units again (4.75 bits,
  ``nibble_forms.compact``).
- a GGUF read keeping its codes (``GgufLinear``): its 4-bit types (Q4_0, Q4_1, Q4_K) as NibbleLinears with their
  offsets; its Q5_0 as ``FiveLinear``: the file's own 5.5 bits a weight, low nibbles, a plane of fifth bits and fp16
  scales (``kernels/nibble_five.py``); its Q6_K as ``SixLinear``: 6.625 bits a weight, low nibbles, their top 2
  bits as tiled crumbs, int8 sub-scales and an fp32 unit per super-block (``kernels/nibble_six.py``); its Q8_0, and a Q5_0 of inputs
  not a multiple of 64 or joined to one of those (cpu_fusion), or a Q6_K whose scales do not factor, as
  ``ByteLinear``: ggml's signed codes a byte each and an fp32 scale per group of 16 or 32
  (``kernels/byte_q8_cpu.py``), all with int8 activations rounded as llama.cpp rounds them for each type; with
  activation quantization off those are dequantized into CpuLinears. A GGUF's quantized output layer, tied or not,
  is one of these (gguf/reader.py keeps its codes).
- an int8 lm_head (``Int8Linear``, opt-in): int8 codes and an fp32 scale per row (``kernels/int8_rows_cpu.py``),
  a quarter of fp32's bytes; a tied embedding keeps its own fp32 table for the lookup.
A PackedLinear the 4-bit kernel cannot run (no compiler, scales not fp32, groups not a multiple of 32)
is dequantized once into a CpuLinear; without the fp32 kernel too (no compiler, not fp32) Linears stay
as they are and PackedLinears become plain Linears of the dequantized weight.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from compress.kernels import byte_q8_cpu, int8_rows_cpu, linear_cpu, nibble_five, nibble_linear_cpu, nibble_q8_cpu, nibble_six
from compress.quant.gguf_blocks import TYPES
from compress.quant.linear import GgufLinear, PackedLinear
from compress.runtime.cpu_modules import (ByteLinear, CpuLinear, FiveLinear, HeldLinear, Int8Linear, NibbleLinear, Scratch,
                                          SixLinear, frozen_bias)
from compress.runtime.kernel_choice import C, FUSE_MARGIN, PANEL, TORCH, Plan


def nibble_ready(m: PackedLinear) -> bool:
    fp32 = m.weight_scale.dtype == torch.float32
    return m.spec.bits <= 4 and fp32 and nibble_linear_cpu.supports(m.weight_scale, m.in_features)


def dense_linear(m: PackedLinear, weight: torch.Tensor) -> nn.Linear:
    """A plain Linear of m's dequantized weight: where no C kernel can run it."""
    new = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
    new.weight = nn.Parameter(weight, requires_grad=False)
    new.bias = frozen_bias(m.bias)
    return new


def swap_gguf(m: GgufLinear, scratch: Scratch, int8_activations: bool) -> nn.Module:
    """The held module of a GGUF read's Linear: nibbles (4-bit types), with int8 activations Q5_0's 5.5 bits or bytes
    (wider types), else fp32."""
    scale = m.weight_scale.float().contiguous()
    if m.bits == 4:
        if nibble_linear_cpu.supports(scale, m.in_features):
            unsigned = m.weight_codes if m.weight_offset is not None else (m.weight_codes.to(torch.int16) + 8).to(torch.uint8)
            offset = m.weight_offset if m.weight_offset is not None else -8 * scale  # Q4_0: s (c + 8) - 8 s, exact
            packed = nibble_linear_cpu.pack_offsets(unsigned, scale, offset)
            int8 = int8_activations and nibble_q8_cpu.supports(scale, m.in_features)
            return NibbleLinear(dict(zip(NibbleLinear.NAMES, packed)), m.bias, scratch, int8)
    elif int8_activations and m.kind == "Q5_0" and nibble_five.supports(m.in_features):
        packed = nibble_five.pack(m.weight_codes.to(torch.int16) + 16, scale)
        return FiveLinear(dict(zip(FiveLinear.NAMES, packed)), m.bias, scratch)
    elif int8_activations and m.kind == "Q6_K" and nibble_six.supports(m.in_features) and (
            scales := nibble_six.super_scales(scale)) is not None:
        packed = nibble_six.pack(m.weight_codes + 32, scales)  # q in [0, 64): int8 holds it
        return SixLinear(dict(zip(SixLinear.NAMES, packed)), m.bias, scratch)
    elif int8_activations and byte_q8_cpu.supports(scale, m.in_features):
        return ByteLinear({"codes": m.weight_codes.contiguous(), "scales": scale}, m.bias, scratch)
    weight = m.dequantized()
    return CpuLinear(weight, m.bias) if linear_cpu.supports(weight) else dense_linear(m, weight)


def swap_one(m: nn.Module, scratch: Scratch, int8_activations: bool = False) -> nn.Module | None:
    """The module that replaces m on the CPU path, or None where m stays as it is."""
    if isinstance(m, GgufLinear):
        return swap_gguf(m, scratch, int8_activations)
    if isinstance(m, PackedLinear):
        if nibble_ready(m):
            int8 = int8_activations and nibble_q8_cpu.supports(m.weight_scale, m.in_features)
            return NibbleLinear.from_codes(*m.codes(), m.bias, scratch, int8)
        weight = m.dequantized()
        return CpuLinear(weight, m.bias) if linear_cpu.supports(weight) else dense_linear(m, weight)
    return CpuLinear(m.weight, m.bias) if linear_cpu.supports(m.weight) else None


def op_of(m: nn.Module) -> str:
    """What a swapped Linear runs, as kernel_choice keys its timings: its shape and kind."""
    if isinstance(m, NibbleLinear):
        kind = f" 4-bit g{m.group_size}" + (" int8 activations" if m.int8_activations else "")
        kind += "" if m.form == "fp32" else f" {m.form} scales"
    elif isinstance(m, ByteLinear):
        kind = f" 8-bit codes g{m.group_size} int8 activations"
    elif isinstance(m, FiveLinear):
        kind = f" 5-bit g{m.group_size} int8 activations fp16 scales"
    elif isinstance(m, SixLinear):
        kind = f" 6-bit g{m.group_size} int8 activations super-block scales"
    else:
        kind = " int8 rows" if isinstance(m, Int8Linear) else " fp32"
    return f"linear {m.out_features}x{m.in_features}{kind}"


@dataclass
class Group:
    """The swapped Linears of one kind and shape: they share a Plan."""

    modules: list[nn.Module]
    plan: Plan | None = None

    @property
    def op(self) -> str:
        return op_of(self.modules[0])

    @property
    def preferred(self) -> str:
        """Within noise, the kernel that needs no scratch: C for held weights, torch for CpuLinears (see kernel_choice)."""
        return TORCH if isinstance(self.modules[0], CpuLinear) else C

    def apply(self, plan: Plan) -> None:
        self.plan = plan
        use_plan(self.modules, plan)

    def describe(self) -> str:
        return f"{self.op} ({len(self.modules)}): {self.plan.describe()}"


@dataclass
class Swapped:
    """What cpu_linears did: the groups that choose a kernel per row count, and PackedLinears dequantized once."""

    groups: list[Group] = field(default_factory=list)
    dequantized: int = 0
    joins: int = 0  # q/k/v and gate/up projections joined into one Linear each (runtime/cpu_fusion.py)
    huge_pages: int = 0  # bytes of held weights moved into one buffer on huge pages (runtime/weight_arena.py)

    def scratch_bytes(self) -> int:
        """The most a Scratch holds: the largest dense weight of a HeldLinear whose plan runs torch somewhere."""
        sizes = [4 * g.modules[0].out_features * g.modules[0].in_features for g in self.groups
                 if isinstance(g.modules[0], HeldLinear) and TORCH in g.plan.choices()]
        return max(sizes, default=0)


def use_plan(modules: list[nn.Module], plan: Plan) -> None:
    """Set swapped Linears' kernel per row count from their group's plan: the tables made once, shared (read only)."""
    choices = plan.choices()
    use_c, use_panel = [k == C for k in choices], [k == PANEL for k in choices]
    fuse_c = plan.near(C, FUSE_MARGIN)  # read by the one-call decode step (cpu_step.DecodeStep.takes)
    for m in modules:
        m.use_c, m.use_panel, m.fuse_c = use_c, use_panel, fuse_c


def group_modules(modules: list[nn.Module]) -> list[Group]:
    groups: dict[str, Group] = {}
    for m in modules:
        groups.setdefault(op_of(m), Group([])).modules.append(m)
    return list(groups.values())


def lm_head_int8(m: nn.Module, scratch: Scratch) -> Int8Linear | None:
    weight = m.dequantized() if isinstance(m, (PackedLinear, GgufLinear)) else m.weight
    return Int8Linear(weight, m.bias, scratch) if int8_rows_cpu.supports(weight) else None


def codes_are_smaller(m: nn.Module) -> bool:
    """Whether a GGUF output layer's own codes read fewer bytes a step than int8 rows (8 bits a weight): its Q6_K
    (6.625) and 4- and 5-bit types do, so they run as the file's codes, as llama.cpp computes them; its Q8_0's
    (a byte and an fp32 scale per 32: 9 bits) do not, and run as int8 rows re-rounded per row (SmolLM2, whose
    576-wide output falls back to Q8_0: 10 % faster decode that way). gguf/reader.py unties a tied output by the
    same fact."""
    return isinstance(m, GgufLinear) and TYPES[m.kind].under_a_byte


def shared_table(new: nn.Module, model: nn.Module) -> nn.Module:
    """``new`` (a GGUF output layer dequantized to fp32), or a CpuLinear over the embedding's table where its values
    are that table's: a tied output the reader kept as codes that do not run here (activation rounding off) then
    shares the table, as a tied one always did, instead of holding a second fp32 copy."""
    if not isinstance(new, CpuLinear) or new.bias is not None:
        return new
    table = model.model.embed_tokens.weight
    return CpuLinear(table, None) if new.weight.shape == table.shape and torch.equal(new.weight, table) else new


def cpu_linears(model: nn.Module, lm_head: str = "stored", int8_activations: bool = False) -> Swapped:
    """Swap every Linear and int4/int3 PackedLinear (see the module doc) in place, grouped by shape;
    each runs torch's kernel (fp32) or the C one (int4/int3) until its group gets a Plan.
    lm_head "int8": the lm_head is held as int8 per row (a tied embedding keeps its own table), or, a GGUF's with its
    codes kept and int8_activations, as the file's codes where those are fewer bytes (``codes_are_smaller``);
    int8_activations: int4 Linears round their inputs to int8 (``nibble_q8_cpu``) where the CPU can."""
    swapped, scratch = Swapped(), Scratch()
    # Names, not modules: a list of the old modules would keep every one alive until the last is swapped.
    for name in [name for name, m in model.named_modules() if type(m) in (nn.Linear, PackedLinear, GgufLinear)]:
        m = model.get_submodule(name)
        as_int8 = lm_head == "int8" and name == "lm_head" and not (int8_activations and codes_are_smaller(m))
        new = (as_int8 and lm_head_int8(m, scratch)) or swap_one(m, scratch, int8_activations)
        if name == "lm_head" and isinstance(m, GgufLinear):
            new = shared_table(new, model)
        if new is None:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
        swapped.dequantized += isinstance(m, (PackedLinear, GgufLinear)) and not isinstance(new, HeldLinear)
    swapped.groups = group_modules(swapped_modules(model))
    return swapped


def swapped_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, (CpuLinear, HeldLinear))]
