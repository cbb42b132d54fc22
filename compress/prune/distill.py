"""Knowledge distillation of a pruned student from its teacher (Minitron's repair step).

Loss: forward KL(teacher || student) of the next-token distributions at temperature T (times T²),
plus, with hidden_weight > 0, the MSE between the teacher's final hidden states and the student's
mapped through a learned Linear (the student may be narrower). AdamW, linear warmup then cosine
decay, gradient accumulation, on `accelerate` (CPU fp32 here; bf16 autocast on a GPU, same code).

Across N processes (`accelerate launch`, `torchrun`; DDP) --batch-size stays the global micro-batch:
each process takes its 1/N slice of the same rows that one process would take, gradients are
averaged, so a step means the same data and tokens whatever N is. Everything that decides the next
step is in the checkpoint (weights, optimizer, scheduler, step; the data order is a seeded
permutation) and none of it depends on N: a resumed run continues with identical state, also with
another number of processes. Only the main process writes checkpoints and shows progress.

Sharded (FSDP, ``sharding.py``) the math is the same; the student's weights, gradients and optimizer
state and the teacher's weights are split over the processes, and checkpoints gather whole tensors.
"""

import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from compress import world
from compress.errors import UserError
from compress.model.decoder import Decoder
from compress.model.load import build, load_weights
from compress.prune import sharding
from compress.prune.config import DistillConfig
from compress.prune.stop import StopRequest


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over tokens of KL(teacher || student) at temperature T, scaled by T². logits [N, V]."""
    s = F.log_softmax(student_logits.float() / temperature, -1)
    t = F.log_softmax(teacher_logits.float() / temperature, -1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean") * temperature**2


def lr_lambda(cfg: DistillConfig):
    warm = max(1, int(cfg.warmup * cfg.steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, cfg.steps - warm)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return factor


@torch.no_grad()
def held_out_nll(logits_of: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor, batch: int) -> torch.Tensor:
    """[2] float64: summed next-token NLL and token count of rows [N, T]; logits_of: ids [B, T] -> [B, T, V]."""
    total = torch.zeros(2, dtype=torch.float64, device=rows.device)
    for chunk in rows.split(batch):
        logits = logits_of(chunk)[:, :-1]  # [B, T-1, V]
        total[0] += F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum").double()
        total[1] += chunk[:, 1:].numel()
    return total


class Student(nn.Module):
    """The student and the projection of its hidden states onto the teacher's: one module, so that DDP sees the
    forward of everything trained."""

    def __init__(self, decoder: Decoder, proj: nn.Linear | None):
        super().__init__()
        self.decoder, self.proj = decoder, proj

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, T, V] and the projected hidden states [B, T, Ct] (None without a projection)."""
        hidden = self.decoder.hidden(ids)  # [B, T, Cs]
        return self.decoder.logits(hidden), None if self.proj is None else self.proj(hidden)


class Teacher(nn.Module):
    """The frozen teacher as one module whose forward gives what the loss needs (FSDP gathers its outer weights
    around a module's forward)."""

    def __init__(self, decoder: Decoder):
        super().__init__()
        self.decoder = decoder.eval().requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Final hidden states [B, T, Ct] and logits [B, T, V]."""
        hidden = self.decoder.hidden(ids)
        return hidden, self.decoder.logits(hidden)


def split_state(weights: dict[str, torch.Tensor], tied: bool) -> tuple[dict, dict]:
    """A Student's state by parameter name -> the decoder's (without a tied lm_head) and the projection's."""
    parts = [{k.removeprefix(p): v.detach().contiguous() for k, v in weights.items() if k.startswith(p)}
             for p in ("decoder.", "proj.")]
    if tied:
        parts[0].pop("lm_head.weight", None)
    return parts[0], parts[1]


CHECKPOINT_FORMAT = 2  # 2: optimizer state keyed by parameter name (1: by position)


class Distiller:
    """One distillation run; `run()` trains to the budget, saving to ckpt_dir every save_every steps. fsdp: shard
    the models over the processes (when there are several)."""

    def __init__(self, teacher: Decoder, student: Decoder, train: torch.Tensor, held_out: torch.Tensor,
                 cfg: DistillConfig, ckpt_dir: Path, fsdp: bool = False):
        from accelerate import Accelerator
        from accelerate.utils import DataLoaderConfiguration

        self.cfg, self.ckpt_dir = cfg, Path(ckpt_dir)
        # split_batches: our micro-batch is already the global one, so the scheduler steps once a step, not N times
        cuda = torch.cuda.is_available()
        self.accelerator = Accelerator(cpu=not cuda, mixed_precision="bf16" if cuda else "no",  # cpu: gloo across processes
                                       gradient_accumulation_steps=cfg.grad_accum,
                                       dataloader_config=DataLoaderConfiguration(split_batches=True))
        if self.accelerator.num_processes != world.size():  # N unconnected copies would each train alone
            raise UserError(f"launched as {world.size()} processes but accelerate set up "
                            f"{self.accelerator.num_processes}; {world.CPU_LAUNCH}")
        n, device = self.accelerator.num_processes, self.accelerator.device
        cfg.check_processes(n)
        self.sharded = fsdp and n > 1
        if self.sharded and len(held_out) % n:  # every process must run as many sharded forwards
            raise UserError(f"--eval-rows {len(held_out)} does not split over {n} processes under FSDP; "
                            f"use a multiple of {n}")
        self.teacher = Teacher(teacher)
        torch.manual_seed(cfg.seed)  # the projection's initial weights, the same in every process and run
        proj = nn.Linear(student.cfg.hidden_size, teacher.cfg.hidden_size, bias=False) if cfg.hidden_weight else None
        model = Student(student.train().requires_grad_(True), proj)
        if self.sharded:  # before the optimizer is made: sharding replaces the parameters
            sharding.shard(self.teacher, teacher, device, trained=False)
            sharding.shard(model, student, device, trained=True)
        else:
            self.teacher.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        if self.sharded:
            self.student = model
            self.optimizer, self.scheduler = self.accelerator.prepare(optimizer, scheduler)
        else:
            self.student, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.train_rows = train
        self.held_out = held_out.tensor_split(n)[self.accelerator.process_index]
        self.held_out = self.held_out.to(self.accelerator.device)
        self.order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed))
        self.step, self.curve = 0, []  # curve: {"step", "tokens", "kd_loss", "held_out_ppl"?}
        self.stop = StopRequest()

    @property
    def model(self) -> Student:
        return self.accelerator.unwrap_model(self.student)

    def batch(self, micro: int) -> torch.Tensor:
        """[B / N, T]: this process's slice of micro-batch `micro` of the run (wrapping around the data when the
        budget needs it)."""
        acc, size = self.accelerator, self.cfg.batch_size // self.accelerator.num_processes
        start = micro * self.cfg.batch_size + acc.process_index * size
        idx = self.order[torch.arange(start, start + size) % len(self.order)]
        return self.train_rows[idx].to(acc.device)

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self.accelerator.autocast():
            t_hidden, t_logits = self.teacher(ids)  # [B, T, Ct], [B, T, V]
        with self.accelerator.autocast():
            s_logits, projected = self.student(ids)  # [B, T, V], [B, T, Ct] or None
            loss = kd_loss(s_logits.flatten(0, 1), t_logits.flatten(0, 1), self.cfg.temperature)
            if projected is not None:
                loss = loss + self.cfg.hidden_weight * F.mse_loss(projected.float(), t_hidden.float())
        return loss

    def train_step(self) -> float:
        """One optimizer step; returns its loss averaged over the micro-batches and processes."""
        total = torch.zeros((), device=self.accelerator.device)
        for k in range(self.cfg.grad_accum):
            with self.accelerator.accumulate(self.student):
                loss = self.loss(self.batch(self.step * self.cfg.grad_accum + k))
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.scheduler.step()  # accelerate's wrapper steps only when gradients sync
                self.optimizer.zero_grad()
            total += loss.detach() / self.cfg.grad_accum
        self.step += 1
        return self.accelerator.reduce(total, "mean").item()

    def evaluate(self) -> float:
        """Held-out perplexity; each process scores its share of the rows, through the wrapped model as in training."""
        self.student.eval()
        nll = held_out_nll(lambda ids: self.student(ids)[0], self.held_out, self.cfg.batch_size)
        self.student.train()
        nll, count = self.accelerator.reduce(nll, "sum").tolist()
        return math.exp(nll / count)

    def stop_requested(self) -> bool:
        """Whether any process was asked to stop (all processes call this after every step)."""
        flag = torch.tensor(float(self.stop.requested), device=self.accelerator.device)
        return self.accelerator.reduce(flag, "sum").item() > 0

    def run(self) -> list[dict]:
        cfg, main = self.cfg, self.accelerator.is_main_process
        bar = tqdm(total=cfg.steps, initial=self.step, desc="distill", unit="step", disable=not main)
        if self.step == 0:
            self.curve.append({"step": 0, "tokens": 0, "held_out_ppl": round(self.evaluate(), 4)})
        start, start_step = time.perf_counter(), self.step
        with self.stop.installed():
            while self.step < cfg.steps:
                loss = self.train_step()
                point = {"step": self.step, "tokens": self.step * cfg.tokens_per_step, "kd_loss": round(loss, 5)}
                if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                    point["held_out_ppl"] = round(self.evaluate(), 4)
                self.curve.append(point)
                rate = (self.step - start_step) * cfg.tokens_per_step / (time.perf_counter() - start)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:.0f}")
                bar.update()
                if self.stop_requested():
                    self.save()
                    bar.close()
                    if main:
                        print(f"distillation stopped after step {self.step}; checkpoint saved to {self.ckpt_dir} "
                              f"(resume with --resume)", file=sys.stderr)
                    raise KeyboardInterrupt
                if self.step % cfg.save_every == 0:
                    self.save()
        bar.close()
        return self.curve

    def trained_decoder(self) -> Decoder | None:
        """The student as one fp32 Decoder on the CPU of the main process (None in the others; sharded, every
        process calls it)."""
        if not self.sharded:
            return self.model.decoder.float().cpu()
        weights = sharding.model_state(self.model, sharded=True)
        if not self.accelerator.is_main_process:
            return None
        decoder, _ = split_state(weights, self.model.decoder.cfg.tie_word_embeddings)
        return load_weights(build(self.model.decoder.cfg), {k: v.float() for k, v in decoder.items()})

    def save(self) -> None:
        """The main process writes the checkpoint next to the old one and swaps it in, so a kill mid-save loses
        nothing; the others wait for it (sharded, they first send it their shards)."""
        weights = sharding.model_state(self.model, self.sharded)
        optim = sharding.optimizer_state(self.model, self.optimizer.optimizer, self.sharded)
        if self.accelerator.is_main_process:
            tmp, old = (self.ckpt_dir.with_name(self.ckpt_dir.name + suffix) for suffix in (".tmp", ".old"))
            self.write(tmp, weights, optim)
            if self.ckpt_dir.exists():
                self.ckpt_dir.rename(old)
            tmp.rename(self.ckpt_dir)
            if old.exists():
                shutil.rmtree(old)
        self.accelerator.wait_for_everyone()

    def write(self, tmp: Path, weights: dict[str, torch.Tensor], optim: dict) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        decoder, proj = split_state(weights, self.model.decoder.cfg.tie_word_embeddings)
        save_file(decoder, str(tmp / "student.safetensors"))
        if proj:
            save_file(proj, str(tmp / "proj.safetensors"))
        torch.save(optim, tmp / "optim.pt")
        torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
        state = {"format": CHECKPOINT_FORMAT, "step": self.step, "curve": self.curve, "config": asdict(self.cfg),
                 "processes": self.accelerator.num_processes}
        (tmp / "state.json").write_text(json.dumps(state))

    def load(self) -> None:
        """Continue from ckpt_dir (weights, optimizer, scheduler, step, curve); the config must match, the number of
        processes need not (nothing in the state depends on it), nor whether it was sharded."""
        state_path = self.ckpt_dir / "state.json"
        if not state_path.is_file():
            raise UserError(f"--resume: no distillation checkpoint at {self.ckpt_dir}")
        state = json.loads(state_path.read_text())
        if state.get("format") != CHECKPOINT_FORMAT:
            raise UserError(f"--resume: the checkpoint at {self.ckpt_dir} was written by an older compress; "
                            f"start again without --resume")
        if state["config"] != asdict(self.cfg):
            raise UserError(f"--resume: the checkpoint at {self.ckpt_dir} was made with other distillation settings")
        weights, optim = {}, {}
        if self.accelerator.is_main_process or not self.sharded:  # sharded, the main process reads and scatters
            weights = {f"decoder.{k}": v for k, v in load_file(str(self.ckpt_dir / "student.safetensors")).items()}
            if self.model.decoder.cfg.tie_word_embeddings:
                weights["decoder.lm_head.weight"] = weights["decoder.model.embed_tokens.weight"]
            if self.model.proj is not None:
                weights |= {f"proj.{k}": v for k, v in load_file(str(self.ckpt_dir / "proj.safetensors")).items()}
            optim = torch.load(self.ckpt_dir / "optim.pt", weights_only=True, map_location="cpu")
        sharding.load_states(self.model, self.optimizer.optimizer, weights, optim, self.sharded)
        self.scheduler.load_state_dict(torch.load(self.ckpt_dir / "scheduler.pt", weights_only=True, map_location="cpu"))
        self.step, self.curve = state["step"], state["curve"]
