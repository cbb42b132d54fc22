"""Knowledge distillation of a pruned student from its teacher (Minitron's repair step).

Loss: forward KL(teacher || student) of the next-token distributions at temperature T (times T²),
plus, with hidden_weight > 0, the MSE between the teacher's final hidden states and the student's
mapped through a learned Linear (the student may be narrower). AdamW, linear warmup then cosine
decay, gradient accumulation, on `accelerate` (CPU fp32 here; bf16 autocast on a GPU, same code).

Everything that decides the next step is in the checkpoint (weights, optimizer, scheduler, step;
the data order is a seeded permutation), so a resumed run continues with identical state.
"""

import json
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm import tqdm

from compress.errors import UserError
from compress.model.decoder import Decoder
from compress.model.load import state_for_saving
from compress.prune.config import DistillConfig


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
def held_out_ppl(model: Decoder, rows: torch.Tensor, batch: int) -> float:
    nll, count = 0.0, 0
    for chunk in rows.split(batch):
        logits = model(chunk)[:, :-1]  # [B, T-1, V]
        nll += F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum").item()
        count += chunk[:, 1:].numel()
    return math.exp(nll / count)


class Distiller:
    """One distillation run; `run()` trains to the budget, saving to ckpt_dir every save_every steps."""

    def __init__(self, teacher: Decoder, student: Decoder, train: torch.Tensor, held_out: torch.Tensor,
                 cfg: DistillConfig, ckpt_dir: Path):
        from accelerate import Accelerator

        self.cfg, self.ckpt_dir = cfg, Path(ckpt_dir)
        self.accelerator = Accelerator(mixed_precision="bf16" if torch.cuda.is_available() else "no",
                                       gradient_accumulation_steps=cfg.grad_accum)
        self.teacher = teacher.eval().requires_grad_(False).to(self.accelerator.device)
        self.student = student.train().requires_grad_(True)
        self.proj = nn.Linear(student.cfg.hidden_size, teacher.cfg.hidden_size, bias=False) if cfg.hidden_weight else None
        params = list(self.student.parameters()) + (list(self.proj.parameters()) if self.proj else [])
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.student, self.optimizer, self.scheduler = self.accelerator.prepare(self.student, self.optimizer, self.scheduler)
        if self.proj is not None:
            self.proj = self.accelerator.prepare(self.proj)
        self.train_rows, self.held_out = train, held_out.to(self.accelerator.device)
        self.order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed))
        self.step, self.curve = 0, []  # curve: {"step", "tokens", "kd_loss", "held_out_ppl"?}

    def batch(self, micro: int) -> torch.Tensor:
        """[B, T] rows for micro-batch `micro` of the run; wraps around the data when the budget needs it."""
        start = micro * self.cfg.batch_size
        idx = self.order[torch.arange(start, start + self.cfg.batch_size) % len(self.order)]
        return self.train_rows[idx].to(self.accelerator.device)

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self.accelerator.autocast():
            t_hidden = self.teacher.hidden(ids)  # [B, T, Ct]
            t_logits = self.teacher.lm_head(t_hidden)
        with self.accelerator.autocast():
            s_hidden = self.accelerator.unwrap_model(self.student).hidden(ids)  # [B, T, Cs]
            s_logits = self.accelerator.unwrap_model(self.student).lm_head(s_hidden)
            loss = kd_loss(s_logits.flatten(0, 1), t_logits.flatten(0, 1), self.cfg.temperature)
            if self.proj is not None:
                loss = loss + self.cfg.hidden_weight * F.mse_loss(self.proj(s_hidden).float(), t_hidden.float())
        return loss

    def train_step(self) -> float:
        total = 0.0
        for k in range(self.cfg.grad_accum):
            with self.accelerator.accumulate(self.student):
                loss = self.loss(self.batch(self.step * self.cfg.grad_accum + k))
                self.accelerator.backward(loss)
                self.optimizer.step()
                self.scheduler.step()  # accelerate's wrapper steps only when gradients sync
                self.optimizer.zero_grad()
            total += loss.item() / self.cfg.grad_accum
        self.step += 1
        return total

    def evaluate(self) -> float:
        model = self.accelerator.unwrap_model(self.student).eval()
        ppl = held_out_ppl(model, self.held_out, self.cfg.batch_size)
        model.train()
        return ppl

    def run(self) -> list[dict]:
        cfg = self.cfg
        bar = tqdm(total=cfg.steps, initial=self.step, desc="distill", unit="step")
        if self.step == 0:
            self.curve.append({"step": 0, "tokens": 0, "held_out_ppl": round(self.evaluate(), 4)})
        start, start_step = time.perf_counter(), self.step
        try:
            while self.step < cfg.steps:
                loss = self.train_step()
                point = {"step": self.step, "tokens": self.step * cfg.tokens_per_step, "kd_loss": round(loss, 5)}
                if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                    point["held_out_ppl"] = round(self.evaluate(), 4)
                self.curve.append(point)
                rate = (self.step - start_step) * cfg.tokens_per_step / (time.perf_counter() - start)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{rate:.0f}")
                bar.update()
                if self.step % cfg.save_every == 0:
                    self.save()
        except KeyboardInterrupt:
            self.save()
            bar.close()
            print(f"distillation interrupted at step {self.step}; checkpoint saved to {self.ckpt_dir} (resume with --resume)")
            raise
        bar.close()
        return self.curve

    def save(self) -> None:
        """Write the checkpoint next to the old one and swap it in, so a kill mid-save loses nothing."""
        tmp = self.ckpt_dir.with_name(self.ckpt_dir.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        save_file(state_for_saving(self.accelerator.unwrap_model(self.student)), str(tmp / "student.safetensors"))
        if self.proj is not None:
            save_file(self.accelerator.unwrap_model(self.proj).state_dict(), str(tmp / "proj.safetensors"))
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}, tmp / "optim.pt")
        (tmp / "state.json").write_text(json.dumps({"step": self.step, "curve": self.curve, "config": asdict(self.cfg)}))
        old = self.ckpt_dir.with_name(self.ckpt_dir.name + ".old")
        if self.ckpt_dir.exists():
            self.ckpt_dir.rename(old)
        tmp.rename(self.ckpt_dir)
        if old.exists():
            shutil.rmtree(old)

    def load(self) -> None:
        """Continue from ckpt_dir (weights, optimizer, scheduler, step, curve); the config must match."""
        state_path = self.ckpt_dir / "state.json"
        if not state_path.is_file():
            raise UserError(f"--resume: no distillation checkpoint at {self.ckpt_dir}")
        state = json.loads(state_path.read_text())
        if state["config"] != asdict(self.cfg):
            raise UserError(f"--resume: the checkpoint at {self.ckpt_dir} was made with other distillation settings")
        student = self.accelerator.unwrap_model(self.student)
        tensors = load_file(str(self.ckpt_dir / "student.safetensors"))
        if student.cfg.tie_word_embeddings:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        student.load_state_dict(tensors)
        if self.proj is not None:
            self.accelerator.unwrap_model(self.proj).load_state_dict(load_file(str(self.ckpt_dir / "proj.safetensors")))
        optim = torch.load(self.ckpt_dir / "optim.pt", weights_only=True)
        self.optimizer.load_state_dict(optim["optimizer"])
        self.scheduler.load_state_dict(optim["scheduler"])
        self.step, self.curve = state["step"], state["curve"]
