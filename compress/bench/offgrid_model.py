"""smollm2-135m-offgrid: the built-in SmolLM2-135M trained briefly so that its weights leave their 4-bit grid.

The built-in model ships as a Q4_1 GGUF, so every decoder Linear weight sits exactly on a 4-bit grid
(one step d and offset m per block of 32 input columns: w = m + q d, q in 0..15). Re-quantizing such
weights with round-to-nearest is flattered. This script fine-tunes the whole model (fp32, AdamW) on
short sequences of C4 documents that calibration does not use, until every decoder weight matrix is
as far from its original grid as random weights would be, and writes it to the cache where
`compress ... smollm2-135m-offgrid` finds it.

The measure, per matrix: the mean distance of each weight to the nearest point of its original
block's grid, in units of that block's step d. On the grid it is 0; weights spread uniformly over a
block's range give 0.25. Training stops once the lowest matrix reaches ``--target`` (checked every
``--check-every`` steps) or at ``--max-steps``.

    python -m compress.bench.offgrid_model            # or: make offgrid
    python -m compress.bench.offgrid_model --max-steps 2 --out /tmp/offgrid-try --force

Deterministic for a seed on one host and thread count. The output is staged and renamed into place:
an interrupted run leaves nothing at --out.
"""

import random
import statistics
import time
from pathlib import Path

import click
import torch
from tqdm import tqdm

from compress import models
from compress.calib import read_texts
from compress.errors import UserError
from compress.gguf.family import unpermute_rows
from compress.manifest import write_manifest
from compress.model.load import load_decoder, save_decoder
from compress.outdir import check_target, staged
from compress.prune.distill import kd_loss
from compress.quant.gguf_blocks import TYPES, unpack
from compress.quant.primitives import IntSpec, grouped, pseudo_quantize

NAME = "smollm2-135m-offgrid"
BLOCK = 32  # Q4_1's block of input columns
LEVELS = 16
# GGUF tensor names of the decoder Linears -> the HF module names
GGUF_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
CALIB_SEEDS = (0, 1)  # the calibration seeds our results use (QuantConfig's default 0, and 1 in quality.md)
CALIB_TOKENS = 128 * 512  # QuantConfig's default calib_samples x calib_seq_len; the prune importance set is a prefix


def default_out() -> Path:
    return models.cache_dir() / NAME


# ---- the measure --------------------------------------------------------------------------------------------------

def q4_1_grids(gguf_path: Path, heads: int, kv_heads: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF weight name -> (step d, offset m), each [O, I/32] fp32, of every Q4_1 decoder Linear in the GGUF, in HF
    row order (read by gguf_blocks.unpack: Q4_1's d is never negative, so its grid is (d, m) as stored)."""
    import numpy as np
    from gguf import GGUFReader, GGMLQuantizationType

    q4_1, grids = TYPES["Q4_1"], {}
    for t in GGUFReader(str(gguf_path)).tensors:
        parts = t.name.split(".")  # blk.{i}.{kind}.weight
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in GGUF_LINEARS:
            continue
        if t.tensor_type != GGMLQuantizationType.Q4_1:
            raise UserError(f"{gguf_path}: {t.name} is {t.tensor_type.name}, not Q4_1")
        raw = torch.from_numpy(np.asarray(t.data).copy())  # [O, I/32 * 20]
        _, grid = unpack(q4_1, raw, raw.shape[1] // q4_1.type_size * q4_1.block)
        d, m = grid.a, grid.b
        if parts[2] in ("attn_q", "attn_k"):
            h = heads if parts[2] == "attn_q" else kv_heads
            d, m = unpermute_rows(d, h), unpermute_rows(m, h)
        grids[f"model.layers.{parts[1]}.{GGUF_LINEARS[parts[2]]}.weight"] = (d, m)
    return grids


def grid_distance(w: torch.Tensor, step: torch.Tensor, low: torch.Tensor) -> float:
    """Mean over the weights w [O, I] of |w - nearest point of m + q d, q in 0..15| / d, with d, m [O, I/32] per block.
    0 on the grid; about 0.25 for weights spread uniformly over a block's range. Blocks with d = 0 are left out."""
    t = (grouped(w.float(), BLOCK) - low[..., None]) / step.clamp(min=1e-30)[..., None]  # [O, G, 32] in steps
    dist = (t - t.round().clamp(0, LEVELS - 1)).abs()
    keep = (step > 0)[..., None].expand_as(dist)
    return dist[keep].mean().item()


def rtn_error(w: torch.Tensor, group: int = BLOCK) -> float:
    """||w - RTN int4(w)||^2 / ||w||^2, asymmetric, ``group`` columns per scale."""
    w = w.float()
    return ((w - pseudo_quantize(w, IntSpec(4, group))).pow(2).sum() / w.pow(2).sum()).item()


def q4_1_error(w: torch.Tensor) -> float:
    """The same for llama.cpp's Q4_1 rounding: per block of 32, d = (max - min) / 15 and w = min + q d (no zero point
    held on the grid), in fp32. On the built-in model's weights it is about 0."""
    g = grouped(w.float(), BLOCK)
    low, step = g.amin(-1, keepdim=True), (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)).clamp(min=1e-30) / (LEVELS - 1)
    back = low + ((g - low) / step).round() * step
    return ((g - back).pow(2).sum() / g.pow(2).sum()).item()


def shuffled_rows(w: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """w with each row's entries in a random order: the same values per row, no block grid left."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(w.shape, generator=g).argsort(-1)
    return w.gather(-1, order)


def measure(model, grids: dict) -> list[dict]:
    """Per decoder matrix: name, grid distance, RTN int4 g32 error (ours and Q4_1's rounding), and each error over
    that of the same matrix with its rows shuffled (the same values, no grid)."""
    params = dict(model.named_parameters())
    rows = []
    for name, (d, m) in grids.items():
        w = params[name].detach()
        shuffled = shuffled_rows(w)
        err, q41 = rtn_error(w), q4_1_error(w)
        rows.append({"name": name, "grid_distance": grid_distance(w, d, m), "rtn_g32": err,
                     "rtn_g32_vs_shuffled": err / rtn_error(shuffled), "q4_1_vs_shuffled": q41 / q4_1_error(shuffled)})
    return rows


def summary(rows: list[dict]) -> dict:
    """min / median / max of each measured column over the matrices."""
    cols = [k for k in rows[0] if k != "name"]
    return {k: {"min": min(r[k] for r in rows), "median": statistics.median(r[k] for r in rows),
                "max": max(r[k] for r in rows)} for k in cols}


def summary_table(before: dict, after: dict) -> str:
    lines = ["| per matrix | before min | median | max | after min | median | max |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k in before:
        b, a = before[k], after[k]
        lines.append(f"| {k} | {b['min']:.4f} | {b['median']:.4f} | {b['max']:.4f} | {a['min']:.4f} | {a['median']:.4f} | {a['max']:.4f} |")
    return "\n".join(lines)


# ---- the data and the training ------------------------------------------------------------------------------------

def calibration_documents(tokenizer, texts: list[str], seeds=CALIB_SEEDS, tokens: int = CALIB_TOKENS) -> set[int]:
    """Indices of the documents compress.calib.calibration_tokens reads for these seeds (it shuffles the list with
    random.Random(seed) and reads until it has ``tokens`` tokens; a shuffle's order depends only on the length)."""
    used = set()
    for seed in seeds:
        order = list(range(len(texts)))
        random.Random(seed).shuffle(order)
        n = 0
        for i in order:
            used.add(i)
            n += len(tokenizer(texts[i], add_special_tokens=False).input_ids)
            if n >= tokens:
                break
    return used


def training_rows(tokenizer, rows: int, seq_len: int, seed: int) -> tuple[torch.Tensor, int]:
    """[rows, seq_len] token ids from the C4 documents calibration does not use (seeded order, EOS between
    documents), and how many documents were held apart."""
    texts = read_texts(None)
    held = calibration_documents(tokenizer, texts)
    free = [i for i in range(len(texts)) if i not in held]
    random.Random(seed).shuffle(free)
    need, ids = rows * seq_len, []
    for i in free:
        ids.extend(tokenizer(texts[i], add_special_tokens=False).input_ids + [tokenizer.eos_token_id])
        if len(ids) >= need:
            break
    if len(ids) < need:
        raise UserError(f"the C4 documents apart from calibration hold {len(ids)} tokens, fewer than {need}; "
                        "ask for fewer --max-steps, --batch-size or --seq-len")
    return torch.tensor(ids[:need]).view(rows, seq_len), len(held)


def dither(model, grids: dict, scale: float, seed: int) -> None:
    """Add to every decoder weight uniform noise of width ``scale`` x its block's Q4_1 step d (1.0: +-d/2, which
    spreads each weight evenly over its cell: grid distance 0.25)."""
    if scale == 0:
        return
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, (d, _) in grids.items():
            w = params[name]
            step = d.repeat_interleave(BLOCK, -1)  # [O, I]
            w.add_((torch.rand(w.shape, generator=g) - 0.5) * scale * step)


def train_step(model, teacher, optimizer, ids: torch.Tensor) -> float:
    """One AdamW step of KL(teacher || model) of the next-token distributions on ids [B, T]; returns the loss."""
    with torch.no_grad():
        target = teacher(ids).flatten(0, 1)  # [B T, V]
    loss = kd_loss(model(ids).flatten(0, 1), target, 1.0)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def train(model, teacher, rows: torch.Tensor, lr: float, batch: int, steps: int) -> list[dict]:
    """``steps`` AdamW steps on consecutive batches of rows [N, T]; returns the loss every tenth step."""
    model.train().requires_grad_(True)
    teacher.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    curve = []
    for step in tqdm(range(steps), desc="training", unit="step"):
        loss = train_step(model, teacher, optimizer, rows[step * batch:(step + 1) * batch])
        if step % 10 == 0 or step == steps - 1:
            curve.append({"step": step + 1, "kd_loss": float(f"{loss:.6g}")})
            tqdm.write(f"step {step + 1}: KL {loss:.4f}")
    model.eval().requires_grad_(False)
    return curve


@click.command()
@click.option("--out", type=click.Path(), default=None, help=f"output directory [default: the cache's {NAME}]")
@click.option("--noise", default=1.0, show_default=True, help="dither width in Q4_1 steps before training (0: train only)")
@click.option("--lr", default=2e-5, show_default=True)
@click.option("--batch-size", default=4, show_default=True)
@click.option("--seq-len", default=128, show_default=True)
@click.option("--steps", default=100, show_default=True)
@click.option("--target", default=0.2, show_default=True, help="refuse to write unless every matrix's grid distance reaches this")
@click.option("--seed", default=0, show_default=True)
@click.option("--force", is_flag=True, help="replace an existing output")
def main(out, noise, lr, batch_size, seq_len, steps, target, seed, force):
    out = Path(out) if out else default_out()
    check_target(out, force)  # before the training, not after it
    src = models.resolve(models.DEFAULT_MODEL)
    tokenizer = models.load_tokenizer(src)
    rows, held = training_rows(tokenizer, steps * batch_size, seq_len, seed)
    torch.manual_seed(seed)
    teacher, model = load_decoder(src), load_decoder(src)
    grids = q4_1_grids(models.builtin_gguf(models.DEFAULT_MODEL), model.cfg.num_heads, model.cfg.num_kv_heads)
    before = measure(model, grids)
    start = time.perf_counter()
    dither(model, grids, noise, seed)
    curve = train(model, teacher, rows, lr, batch_size, steps)
    seconds = time.perf_counter() - start
    after = measure(model, grids)
    tokens = steps * batch_size * seq_len
    print(f"\nnoise {noise} step, {steps} steps, lr {lr}, {tokens} tokens, {seconds:.0f} s, "
          f"{held} calibration documents held apart; {len(after)} decoder matrices:\n")
    print(summary_table(summary(before), summary(after)))
    low = min(r["grid_distance"] for r in after)
    if low < target:
        raise UserError(f"the lowest matrix grid distance is {low:.3f}, under --target {target}; nothing written "
                        "(raise --noise, or train longer)")
    with staged(out, force) as tmp:
        save_decoder(model, tmp, src)
        write_manifest(tmp, source=str(src), recipe={
            "what": "compress.bench.offgrid_model: Q4_1-step dither, then distillation from the original",
            "noise": noise, "lr": lr, "optimizer": "AdamW(0.9, 0.95), no decay, constant lr", "batch_size": batch_size,
            "seq_len": seq_len, "steps": steps, "tokens": tokens, "seed": seed, "seconds": round(seconds, 1),
            "calibration_documents_held_apart": held}, curve=curve, grid=summary(after), matrices=after)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
