"""`compress prune-distill` across processes (`accelerate launch`, DDP or FSDP over gloo on CPU): the same run as
one process, OUT written once, Ctrl-C stops every process with a checkpoint, bad launches are one line."""

import os
import signal
import subprocess
import time

import pytest
from safetensors.torch import load_file

from tests.conftest import launch, launch_command, read_json
from tests.test_cli import assert_one_line_error, run
from tests.commands.test_prune_distill import SMALL

ARGS = [*SMALL, "--importance", "magnitude", "--eval-every", "4"]


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_two_processes_train_as_one(model_and_text, tmp_path, fsdp):
    model, text = model_and_text
    one = run("prune-distill", str(model), *ARGS, "--tokens", "512", "--data", str(text), "-o", str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr
    two = launch(2, "-m", "compress.cli", "prune-distill", str(model), *ARGS, "--tokens", "512", "--data", str(text),
                 "-o", str(tmp_path / "two"), fsdp=fsdp)
    assert two.returncode == 0, two.stderr[-3000:]
    assert two.stdout.count("pruned ") == 1 and two.stdout.count("memory: ") == 1  # only the main process speaks
    assert ("AdamW split 2 ways" in two.stdout) == fsdp and ("DDP buckets" in two.stdout) != fsdp
    assert two.stderr.count("distill:   0%|          | 0/16 [00:00<?, ?step/s]") == 1  # and shows progress
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("one", "two"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    curves = [read_json(tmp_path / name / "compress.json")["distill_curve"] for name in ("one", "two")]
    assert [p["step"] for p in curves[1]] == list(range(17))
    for p, q in zip(*curves):
        for key in ("kd_loss", "held_out_ppl"):
            assert p.get(key, 0) == pytest.approx(q.get(key, 0), rel=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_ctrl_c_stops_every_process_with_a_checkpoint_that_resumes(model_and_text, tmp_path, fsdp):
    """DDP: resumed in one process; FSDP (with the hidden-state projection, tied embeddings): resumed sharded."""
    model, text = model_and_text
    out, log = tmp_path / "out", tmp_path / "stderr.txt"
    settings = [*ARGS, "--save-every", "100000", "--tokens", "6400", "--data", str(text), "-o", str(out)]
    settings += ["--hidden-weight", "0.5"] if fsdp else []
    args = ["-m", "compress.cli", "prune-distill", str(model), *settings]
    with open(log, "w") as err:
        cmd, env = launch_command(2, *args, fsdp=fsdp)
        proc = subprocess.Popen(cmd, env=env, stderr=err, stdout=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 300
        while "distill:" not in log.read_text() and time.time() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: every process of the group
        proc.wait(timeout=120)
    assert proc.returncode != 0 and not out.exists()
    state = read_json(tmp_path / ".out.distill-ckpt" / "state" / "state.json")
    assert 0 < state["step"] < 200 and state["processes"] == 2
    assert log.read_text().count("checkpoint saved") == 1
    resumed = launch(2, *args, "--resume", fsdp=True) if fsdp else run(*args[2:], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert [p["step"] for p in read_json(out / "compress.json")["distill_curve"]][-1] == 200


def test_a_batch_that_does_not_split_over_the_processes_is_one_line(model_and_text, tmp_path):
    model, text = model_and_text
    res = launch(2, "-m", "compress.cli", "prune-distill", str(model), *ARGS, "--batch-size", "3", "--tokens", "512",
                 "--data", str(text), "-o", str(tmp_path / "out"))
    assert res.returncode != 0 and not (tmp_path / "out").exists()
    assert res.stderr.count("error: --batch-size 3 (rows a micro-batch, over all processes) does not split over 2") == 1


def test_launches_that_would_not_do_what_was_asked_are_one_line(model_and_text, tmp_path):
    model, _ = model_and_text
    single = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}  # accelerate launch --cpu --num_processes 2
    assert_one_line_error(run("prune-distill", str(model), "--hidden-size", "48", "-o", str(tmp_path / "o"), env=single),
                          "starts a single process", "--multi_gpu")
    copies = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    assert_one_line_error(run("quantize", str(model), "--method", "rtn", "-o", str(tmp_path / "q"), env=copies),
                          "compress quantize runs in one process")
    assert_one_line_error(run("prune-distill", str(model), "--hidden-size", "48", "--no-distill", "-o",
                              str(tmp_path / "p"), env=copies), "--no-distill runs in one process")
    deepspeed = {**copies, "ACCELERATE_USE_DEEPSPEED": "true"}
    assert_one_line_error(run("prune-distill", str(model), "--hidden-size", "48", "-o", str(tmp_path / "d"),
                              env=deepspeed), "sharded with FSDP, not DeepSpeed")
    offload = {**copies, "ACCELERATE_USE_FSDP": "true", "FSDP_OFFLOAD_PARAMS": "true"}
    assert_one_line_error(run("prune-distill", str(model), "--hidden-size", "48", "-o", str(tmp_path / "f"),
                              env=offload), "FSDP does not do CPU offload", "fsdp_offload_params to false")
    assert not any(tmp_path.glob("[opqfd]"))


def test_held_out_rows_that_do_not_split_under_fsdp_are_one_line(model_and_text, tmp_path):
    model, text = model_and_text
    res = launch(2, "-m", "compress.cli", "prune-distill", str(model), *ARGS, "--eval-rows", "3", "--tokens", "512",
                 "--data", str(text), "-o", str(tmp_path / "out"), fsdp=True)
    assert res.returncode != 0 and not (tmp_path / "out").exists()
    assert res.stderr.count("error: --eval-rows 3 does not split over 2 processes under FSDP") == 1
