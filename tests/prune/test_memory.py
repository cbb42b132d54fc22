"""The prune-distill memory estimate: exact counts for known configs, and a refusal before anything loads."""

from types import SimpleNamespace

import pytest
import torch

from compress.commands import prune_distill
from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.prune import memory
from compress.prune.config import DistillConfig, PruneConfig
from compress.prune.shape import Shape
from tests.conftest import save_hf, tiny_hf

LLAMA3_8B = ModelConfig.from_hf(dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                     num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8))
MINITRON_4B = Shape(hidden_size=3072, intermediate_size=9216, num_heads=32, num_kv_heads=8, num_layers=32)
PCFG = PruneConfig(hidden_size=3072)


def test_llama3_8b_to_4b_on_cpu():
    est = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG)
    assert (est.teacher_params, est.student_params) == (8_030_261_248, 4_512_746_496)
    assert (est.teacher, est.student) == (8_030_261_248 * 4, 4_512_746_496 * 16)
    # per token and layer, fp32: norms 2*4*3072 + Linear inputs 2*4*3072 + attention 4*(3*4096 + 2*1024) + MLP 4*4*9216
    assert memory.per_token_layer(LLAMA3_8B, MINITRON_4B, autocast=False) == 24576 + 24576 + 57344 + 147456
    assert est.activations == 8 * 256 * 33 * 253952
    assert est.logits == 8 * 256 * 128256 * (5 * 4 + 2 * 4)
    assert est.describe().startswith("teacher 29.9 GiB fp32, student 67.2 GiB (4.51B x 16 bytes")
    assert memory.gib(est.total) == "120.0" and est.table().splitlines()[-1] == "| total |  |  | 120.0 |"


def test_autocast_projection_and_prune_only():
    gpu = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG, autocast=True)
    assert gpu.student_bytes == 18 and gpu.logits == 8 * 256 * 128256 * (5 * 4 + 2 * 2)
    # bf16: norms 8*3072 + five casts 5*2*3072 + attention 2*(3*4096 + 2*1024) + MLP 4*2*9216
    assert memory.per_token_layer(LLAMA3_8B, MINITRON_4B, autocast=True) == 24576 + 30720 + 28672 + 73728
    hidden = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(hidden_weight=0.5), PCFG)
    assert hidden.student_params == 4_512_746_496 + 3072 * 4096
    only = memory.estimate(LLAMA3_8B, MINITRON_4B, None, PCFG)
    assert (only.student_bytes, only.training) == (4, False) and only.total < gpu.total / 2


def test_check_refuses_in_one_line_only_when_it_does_not_fit():
    est = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG)
    memory.check(est, est.total, "this machine has")
    with pytest.raises(UserError) as e:
        memory.check(est, 21 << 30, "this machine has")
    message = str(e.value)
    assert message.startswith("prune-distill needs about 120.0 GiB (teacher 29.9 GiB fp32, student 67.2 GiB")
    assert "this machine has 21.0 GiB available: use a GPU with more memory" in message and "\n" not in message


def test_processes_split_the_micro_batch_and_share_the_host():
    one = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG)
    two = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG, processes=2)
    assert two.tokens == one.tokens // 2 and two.activations * 2 == one.activations and two.logits * 2 == one.logits
    assert two.student_bytes == 16 + 4 and "AdamW, DDP buckets)" in two.describe()  # no bf16 copy on CPU
    memory.check(two, two.total, "the GPU has")  # one GPU a process
    with pytest.raises(UserError, match=r"needs about 250.8 GiB \(2 processes x teacher .*: start fewer processes"):
        memory.check(two, two.total, "this machine has", copies=2)


def test_refusal_comes_before_anything_is_loaded_and_writes_nothing(tmp_path, monkeypatch):
    model = save_hf(tiny_hf("llama", num_hidden_layers=4), tmp_path / "teacher")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(prune_distill.psutil, "virtual_memory", lambda: SimpleNamespace(available=1 << 20))

    def no_load(*args, **kwargs):
        raise AssertionError("loaded before the memory check")

    monkeypatch.setattr(prune_distill.models, "load_model", no_load)
    monkeypatch.setattr(prune_distill.models, "load_tokenizer", no_load)
    out = tmp_path / "out"
    pcfg = PruneConfig(hidden_size=48, intermediate_size=96, num_layers=3)
    with pytest.raises(UserError, match=r"^prune-distill needs about \d+ MiB .* this machine has 1 MiB available"):
        prune_distill.run_prune_distill(str(model), pcfg, DistillConfig(), str(out))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["teacher"]


def test_fsdp_splits_the_models_but_not_the_gathered_units():
    est = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG, autocast=True, processes=8, sharded=True,
                          on_host=False)
    assert est.teacher == 8_030_261_248 * 4 // 8 and est.student_bytes == 16 / 8 + 2 and est.tokens == 256
    student_outer, teacher_outer = 128256 * 3072 * 2 + 3072, 128256 * 4096 * 2 + 4096
    student_block = (4_512_746_496 - student_outer) // 32
    teacher_block = (8_030_261_248 - teacher_outer) // 32
    assert est.gathered == 8 * (student_outer + 2 * student_block) + 4 * (teacher_outer + 2 * teacher_block)
    assert memory.gib(est.total) == "35.7" and "split 8 ways" in est.describe() and est.loading == 0
    on_cpu = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG, processes=2, sharded=True)
    assert on_cpu.loading == (8_030_261_248 + 4_512_746_496) * 4 and on_cpu.total == on_cpu.training_total


def test_gpu_runs_check_what_the_processes_load_on_the_host():
    est = memory.estimate(LLAMA3_8B, MINITRON_4B, DistillConfig(), PCFG, autocast=True, processes=8, sharded=True,
                          on_host=False)
    memory.check_loading(est, 8 * 47 << 30, copies=8)
    with pytest.raises(UserError) as e:
        memory.check_loading(est, 100 << 30, copies=8)
    assert str(e.value).startswith("prune-distill loads the whole teacher and student in fp32 on the host in every "
                                   "process before moving them to the GPU: 8 processes x 46.7 GiB; this machine has "
                                   "100.0 GiB available") and "\n" not in str(e.value)
