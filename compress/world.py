"""The processes of a multi-process launch (`accelerate launch`, `torchrun`), read from the launcher's
environment, so that a command can tell which process it is before torch.distributed is set up.

Only `compress prune-distill` runs across processes; every other verb refuses a multi-process launch
(N copies would each write the same output).
"""

import os
from contextlib import contextmanager, redirect_stdout

from compress.errors import UserError

CPU_LAUNCH = ("on CPU start N processes with `accelerate launch --multi_gpu --num_processes N -m compress.cli ...` "
              "(gloo on a machine without CUDA) or `torchrun --nproc-per-node N -m compress.cli ...`")


def rank() -> int:
    return int(os.environ.get("RANK", 0))


def size() -> int:
    return int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    """This process's index on its machine (its GPU there)."""
    return int(os.environ.get("LOCAL_RANK", 0))


def local_size() -> int:
    """Processes on this machine (they share its memory)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", size()))


def is_main() -> bool:
    return rank() == 0


def one_process(what: str) -> None:
    """One line when ``what`` (a verb, an option) was launched as several processes."""
    if size() > 1:
        raise UserError(f"{what} runs in one process; start it without accelerate launch or torchrun")


def check_launch(verb: str) -> None:
    """One line for launches that would not do what was asked."""
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" and "MASTER_ADDR" in os.environ and size() == 1:
        # accelerate's --cpu launcher starts one process whatever --num_processes says (several only via mpirun)
        raise UserError(f"`accelerate launch --cpu --num_processes N` starts a single process; {CPU_LAUNCH}")
    if verb != "prune-distill":
        one_process(f"compress {verb}")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":  # ZeRO would need DeepSpeed's checkpoints
        raise UserError("prune-distill runs data-parallel (DDP) or sharded with FSDP, not DeepSpeed: launch without "
                        "the deepspeed settings (docs/prune.md, Several processes)")
    if fsdp_launch():
        for name, what in FSDP_NOT_DONE.items():
            if os.environ.get(name, "").lower() == "true":
                raise UserError(f"prune-distill's FSDP does not do {what}: set {name.lower()} to false in the "
                                f"accelerate config (docs/prune.md, Several processes)")


FSDP_NOT_DONE = {"FSDP_OFFLOAD_PARAMS": "CPU offload", "FSDP_ACTIVATION_CHECKPOINTING": "activation checkpointing"}


def fsdp_launch() -> bool:
    """Whether accelerate was told to use FSDP (`accelerate launch --use_fsdp`, or `distributed_type: FSDP` in its
    config file)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def claim_fsdp(requested: bool) -> bool:
    """Whether to shard: --fsdp or an FSDP launch. compress shards the models itself (prune/sharding.py), so
    accelerate's own FSDP wrapping is switched off in this process."""
    launched = fsdp_launch()
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    return requested or launched


@contextmanager
def main_speaks():
    """Within: only the main process prints (the others would repeat it; program.py turns their progress bars off)."""
    if is_main():
        yield
        return
    with open(os.devnull, "w") as null, redirect_stdout(null):
        yield
