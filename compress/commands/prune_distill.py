"""`compress prune-distill`: importance → shape → slice → distill → write, atomically."""

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import torch

from compress import models, outdir, world
from compress.calib import read_texts
from compress.errors import UserError
from compress.manifest import read_manifest, write_manifest
from compress.model.config import ModelConfig
from compress.model.load import read_config, save_decoder
from compress.prune import memory
from compress.prune.config import DistillConfig, PruneConfig
from compress.prune.importance import Importance, activation_importance, magnitude_importance, random_importance
from compress.prune.shape import Shape, candidates, param_count, validate
from compress.prune.slicing import Keep, prune, select


TEACHER_DTYPE = torch.float32  # the teacher is loaded in fp32 and stays so (bf16 autocast computes on a GPU)


def choose_shape(cfg: ModelConfig, pcfg: PruneConfig) -> Shape:
    full = Shape.of(cfg)
    if pcfg.explicit:
        shape = Shape(*(getattr(pcfg, f) or getattr(full, f) for f in Shape.__dataclass_fields__))
        validate(cfg, shape)
        return shape
    found = candidates(cfg, pcfg.target_params)
    print(f"{len(found)} shapes within 2% of {pcfg.target_params:,} parameters (width before depth; heads kept); best first:")
    print("| hidden | intermediate | heads | kv heads | layers | params |")
    print("|---:|---:|---:|---:|---:|---:|")
    for shape, n in found[:10]:
        print(f"| {shape.hidden_size} | {shape.intermediate_size} | {shape.num_heads} | {shape.num_kv_heads} | "
              f"{shape.num_layers} | {n:,} |")
    return found[0][0]


def importance(teacher, pcfg: PruneConfig, tokenizer) -> Importance:
    if pcfg.importance == "magnitude":
        return magnitude_importance(teacher)
    if pcfg.importance == "random":
        return random_importance(teacher, pcfg.seed)
    from compress.calib import calibration_tokens

    return activation_importance(teacher, calibration_tokens(tokenizer, pcfg))


def check_memory(cfg: ModelConfig, shape: Shape, pcfg: PruneConfig, dcfg: DistillConfig | None, fsdp: bool) -> None:
    """Refuse, before anything is loaded, a run that cannot fit where it runs (the distillation on
    the GPU when there is one, one GPU a process; pruning alone, and everything without a GPU, in
    host memory, which the processes on this machine share)."""
    cuda = dcfg is not None and torch.cuda.is_available()
    est = memory.estimate(cfg, shape, dcfg, pcfg, TEACHER_DTYPE.itemsize, autocast=cuda, processes=world.size(),
                          sharded=fsdp and world.size() > 1, on_host=not cuda)
    available, where = ((torch.cuda.mem_get_info(world.local_rank())[0], "the GPU has") if cuda
                        else (psutil.virtual_memory().available, "this machine has"))
    copies = 1 if cuda else world.local_size()
    if cuda:
        memory.check_loading(est, psutil.virtual_memory().available, world.local_size())
    memory.check(est, available, where, copies)
    print(f"memory: about {memory.size(est.total * copies)} needed ({memory.times(copies)}{est.describe()}); "
          f"{where} {memory.size(available)} available")


def distill_rows(tokenizer, dcfg: DistillConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Documents joined by EOS, cut into [N, seq_len] rows; the last eval_rows are held out."""
    ids: list[int] = []
    for text in read_texts(dcfg.data):
        ids += tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    rows = torch.tensor(ids[: len(ids) // dcfg.seq_len * dcfg.seq_len]).view(-1, dcfg.seq_len)
    if len(rows) <= dcfg.eval_rows:
        raise UserError(f"the distillation data has {len(rows)} rows of {dcfg.seq_len} tokens; "
                        f"more than --eval-rows {dcfg.eval_rows} are needed")
    return rows[: -dcfg.eval_rows], rows[-dcfg.eval_rows:]


def run_prune_distill(model: str, pcfg: PruneConfig, dcfg: DistillConfig | None, output: str, force: bool = False,
                      resume: bool = False, fsdp: bool = False) -> Path:
    with world.main_speaks():
        return prune_and_distill(model, pcfg, dcfg, output, force, resume, world.claim_fsdp(fsdp))


def prune_and_distill(model: str, pcfg: PruneConfig, dcfg: DistillConfig | None, output: str, force: bool,
                      resume: bool, fsdp: bool) -> Path:
    outdir.check_target(output, force)  # an empty or unwritable -o fails before any work
    if dcfg is None:
        world.one_process("--no-distill")
    else:
        dcfg.check_processes(world.size())
    out = Path(output).expanduser()
    src = models.resolve(model)
    if (read_manifest(src) or {}).get("recipe", {}).get("quantize"):
        raise UserError(f"{model} is quantized; prune the unquantized checkpoint, then quantize the result")
    cfg = ModelConfig.from_hf(read_config(src))
    if cfg.moe is not None:
        raise UserError(f"{model} is a mixture of experts ({cfg.arch.model_type}); prune-distill prunes dense models only for now")
    shape = choose_shape(cfg, pcfg)
    check_memory(cfg, shape, pcfg, dcfg, fsdp)
    tokenizer = models.load_tokenizer(src)
    rows = distill_rows(tokenizer, dcfg) if dcfg is not None else None  # bad data fails before the slow part
    teacher = models.load_model(src, TEACHER_DTYPE)
    ckpt = out.parent / f".{out.name}.distill-ckpt"
    start = time.perf_counter()
    if resume and (ckpt / "keep.json").is_file():
        keep = Keep(**json.loads((ckpt / "keep.json").read_text()))
    else:
        keep = select(importance(teacher, pcfg, tokenizer), Shape.of(cfg), shape)
    student = prune(teacher, keep, shape)
    before, after = param_count(cfg, Shape.of(cfg)), param_count(cfg, shape)
    print(f"pruned {before:,} -> {after:,} parameters ({after / before - 1:+.1%}) in {time.perf_counter() - start:.0f} s")
    curve = []
    if dcfg is not None:
        from compress.prune.distill import Distiller

        if world.is_main():
            ckpt.mkdir(parents=True, exist_ok=True)
            (ckpt / "keep.json").write_text(json.dumps(keep.to_json()))
        distiller = Distiller(teacher, student, *rows, dcfg, ckpt / "state", fsdp)
        if resume:
            distiller.load()
        curve = distiller.run()
        student = distiller.trained_decoder()
        distiller.accelerator.end_training()
    if not world.is_main():
        return out  # the main process writes OUT
    with outdir.staged(out, force) as tmp:
        save_decoder(student.eval(), tmp, src)
        write_manifest(tmp, recipe={"prune": asdict(pcfg), "distill": asdict(dcfg) if dcfg else None},
                       source={"model": model, "path": str(src)},
                       shape=asdict(shape), params={"before": before, "after": after}, keep=keep.to_json(),
                       distill_curve=curve, stats={"seconds": round(time.perf_counter() - start, 1)}, quality={})
    shutil.rmtree(ckpt, ignore_errors=True)
    return out
