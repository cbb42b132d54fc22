"""FSDP for prune-distill: the student's weights, gradients and AdamW state, and the teacher's weights, split
over the processes with torch's ``fully_shard`` (FSDP2), one unit per decoder block and one for the rest.

compress shards the models itself rather than through accelerate's FSDP plugin, because accelerate shards
only on accelerators (a ``--cpu``/gloo run is plain data parallel there): this way the code tested on CPU
processes is the code that runs on GPUs. The math is DDP's: each process computes its slice of the
micro-batch and the gradients are averaged (reduce-scattered), so a sharded run trains as one process does.

Checkpoints hold whole tensors, gathered to the main process (``model_state``, ``optimizer_state``) in the
layout an unsharded run writes (optimizer state keyed by parameter name), so a run resumes sharded or not,
with any number of processes; on resume the main process reads them and scatters them (``load_states``).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from compress.model.decoder import Decoder

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on the main process's CPU only
SCATTER = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)  # the main process's whole tensors, split


def shard(root: nn.Module, decoder: Decoder, device: torch.device, trained: bool) -> None:
    """Split root's parameters (root holds decoder) over every process, in place, onto ``device``: each block one
    unit, gathered for its forward and backward and split again after; the embedding, final norm, lm_head (and
    whatever else root holds) one unit, gathered for the whole step when ``trained``, else (a frozen model run
    under no_grad) split again after each forward. Tied embeddings stay one parameter (both in that unit).
    trained: every process then holds the main process's weights, as DDP makes it (a pruning that came out
    differently elsewhere, e.g. on another machine's CPU, would otherwise mix two students)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    whole = root.state_dict() if trained and dist.get_rank() == 0 else {}
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in decoder.model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(root, mesh=mesh, reshard_after_forward=not trained)
    if trained:
        set_model_state_dict(root, whole, options=SCATTER)


def model_state(module: nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """Whole tensors by parameter name; sharded, a collective every process calls, whose result only the main
    process gets (the others get {})."""
    return get_model_state_dict(module, options=GATHER if sharded else StateDictOptions())


def optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer, sharded: bool) -> dict:
    """The optimizer's state keyed by parameter name (not by position), whole tensors; collective as model_state."""
    return get_optimizer_state_dict(module, optimizer, options=GATHER if sharded else StateDictOptions())


def load_states(module: nn.Module, optimizer: torch.optim.Optimizer, weights: dict, optim: dict, sharded: bool) -> None:
    """Set module's weights and optimizer's state from whole tensors; sharded, every process calls it and only the
    main process's arguments are read (the others may pass {})."""
    options = SCATTER if sharded else StateDictOptions()
    set_model_state_dict(module, weights, options=options)
    set_optimizer_state_dict(module, optimizer, optim, options=options)
