"""`compress info` numbers for SmolLM2-135M, checked against hand computation."""

import pytest

from compress.commands.info import print_info
from compress.model.config import ModelConfig
from compress.roofline import GPUS, decode_step, formats, kv_bytes_per_token, param_counts, tokens_per_s_bound, weight_bytes

SMOLLM2 = {
    "model_type": "llama", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "tie_word_embeddings": True, "rope_theta": 100000.0,
}


@pytest.fixture
def cfg():
    return ModelConfig.from_hf(SMOLLM2)


def test_parameter_counts(cfg):
    n = param_counts(cfg)
    assert n["embedding"] == 49152 * 576 == 28_311_552
    assert n["attention"] == 30 * (576 * 576 * 2 + 576 * 192 * 2) == 26_542_080
    assert n["mlp"] == 30 * 3 * 576 * 1536 == 79_626_240
    assert n["norms"] == 61 * 576
    assert n["lm_head"] == 0  # tied
    assert n["total"] == 134_515_008


def test_kv_cache_bytes(cfg):
    assert kv_bytes_per_token(cfg) == 2 * 30 * 3 * 64 * 2 == 23_040


def test_weight_bytes_per_format(cfg):
    fmt = {f.name: f for f in formats(cfg)}
    linear = 26_542_080 + 79_626_240
    rest = 28_311_552 + 61 * 576
    assert weight_bytes(cfg, fmt["fp16"]) == 2 * (linear + rest)
    rows = 30 * (576 + 192 + 192 + 576 + 1536 + 1536 + 576)
    assert weight_bytes(cfg, fmt["int8"]) == linear + 2 * rows + 2 * rest
    assert fmt["int4"].group_size == 64  # 576 is not a multiple of 128
    assert weight_bytes(cfg, fmt["int4"]) == pytest.approx(linear / 2 + linear / 64 * 2.5 + 2 * rest)
    assert weight_bytes(cfg, fmt["int3"]) == pytest.approx(linear * 3 / 8 + linear / 64 * (2 + 3 / 8) + 2 * rest)


def test_decode_step_roofline(cfg):
    fp16 = formats(cfg)[0]
    s = decode_step(cfg, fp16, GPUS["h100"], batch=1, context=1000)
    matmul = 26_542_080 + 79_626_240 + 49152 * 576
    flops = 2 * matmul + 4 * 30 * 9 * 64 * 1000
    nbytes = weight_bytes(cfg, fp16) + 1000 * 23_040
    assert s.flops == flops and s.bytes == nbytes
    assert s.ridge == pytest.approx(989.4 / 3.35)
    assert s.memory_bound
    assert s.tokens_per_s == pytest.approx(1 / (nbytes / 3.35e12))
    big = decode_step(cfg, fp16, GPUS["h100"], batch=4096, context=16)
    assert not big.memory_bound  # a huge batch with short contexts crosses the ridge


def test_tokens_per_s_bound_is_set_by_the_slower_of_bytes_and_flops():
    assert tokens_per_s_bound(4, 2e12, 0.0, tbps=1.0) == pytest.approx(2.0)  # 2 s to read the bytes, 4 tokens
    assert tokens_per_s_bound(4, 1e12, 8e12, tbps=1.0, tflops=2.0) == pytest.approx(1.0)  # 4 s of FLOPs bind


MIXTRAL = {"model_type": "mixtral", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "tie_word_embeddings": False}


def test_mixture_of_experts_counts_active_parameters_and_reads_top_k_experts_per_token():
    cfg = ModelConfig.from_hf(MIXTRAL)
    n = param_counts(cfg)
    expert = 3 * 64 * 96
    assert n["experts"] == 2 * 8 * expert and n["mlp"] == 2 * 8 * 64  # the router: block_sparse_moe.gate
    assert n["active"] == n["total"] - 2 * 6 * expert
    fp16 = formats(cfg)[0]
    assert weight_bytes(cfg, fp16) == 2 * n["total"]
    one = decode_step(cfg, fp16, GPUS["h100"], batch=1, context=10)
    assert one.bytes == 2 * (n["active"] - n["embedding"]) + 10 * kv_bytes_per_token(cfg)
    assert one.flops == 2 * (n["active"] - n["embedding"] - n["norms"]) + 4 * 2 * 4 * 16 * 10
    many = decode_step(cfg, fp16, GPUS["h100"], batch=64, context=10)  # nearly every expert chosen by some token
    assert many.bytes - 64 * 10 * kv_bytes_per_token(cfg) == pytest.approx(2 * (n["total"] - n["embedding"]), rel=1e-3)


def test_info_of_a_mixture_of_experts_reports_active_parameters_and_bytes_per_token(tmp_path, capsys):
    from tests.conftest import save_hf, tiny_hf
    from tests.families import MOE_FAMILIES

    model_dir = save_hf(tiny_hf("mixtral", **MOE_FAMILIES["mixtral"]), tmp_path / "mixtral")
    print_info(str(model_dir), "h100", batch=1, context=100)
    out = capsys.readouterr().out
    n = param_counts(ModelConfig.from_hf(MIXTRAL | {"vocab_size": 256, "intermediate_size": 128, "num_local_experts": 4}))
    assert f"active     {n['active']:>14,}" in out and "2 of 4 routed experts per token in 2 sparse layers" in out
    fp16 = next(line for line in out.splitlines() if line.startswith("| fp16 |")).split("|")
    assert float(fp16[3]) == pytest.approx(2 * (n["active"] - n["embedding"]) / 2**20, abs=0.1)
