"""Run under `accelerate launch`: distill the tiny student of tests/prune for STEPS steps from CKPT
(resuming when it holds a checkpoint), sharded when FSDP is "fsdp"; then save the final checkpoint to CKPT; the
main process writes the student's weights and the curve to OUT, every process the rows it trained on (rows-RANK.pt)."""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compress.model.load import load_decoder  # noqa: E402
from tests.prune.test_distill import cfg, data, student_of  # noqa: E402


def main(teacher_dir: str, ckpt: str, out: str, steps: str, fsdp: str) -> None:
    from compress.prune import sharding
    from compress.prune.distill import Distiller

    teacher = load_decoder(Path(teacher_dir))
    d = Distiller(teacher, student_of(teacher), data(), data(8), cfg(int(steps), grad_accum=2), Path(ckpt),
                  fsdp=fsdp == "fsdp")
    if (Path(ckpt) / "state.json").is_file():
        d.load()
    rows, batch = {}, d.batch

    def recorded(micro: int) -> torch.Tensor:
        rows[micro] = batch(micro)
        return rows[micro]
    d.batch = recorded
    d.run()
    weights = sharding.model_state(d.model, d.sharded)
    d.save()
    if d.accelerator.is_main_process:
        Path(out).mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, f"{out}/student.safetensors")  # untied: no sharing
        (Path(out) / "curve.json").write_text(json.dumps(d.curve))
    d.accelerator.wait_for_everyone()
    torch.save(rows, f"{out}/rows-{d.accelerator.process_index}.pt")
    d.accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:])
