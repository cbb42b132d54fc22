"""Every family prunes (heads, MLP neurons, channels, a layer) to a plain checkpoint that transformers loads with
its own class and whose logits are ours; parameter counts are transformers'; a pruned student distills."""

import pytest
import torch

from compress.model.load import load_decoder, save_decoder
from compress.prune.importance import activation_importance, random_importance
from compress.prune.shape import Shape, param_count
from compress.prune.slicing import prune, select
from tests.conftest import save_hf, tiny_hf
from tests.families import FAMILIES

SHAPE = Shape(hidden_size=32, intermediate_size=96, num_heads=2, num_kv_heads=1, num_layers=2)
THREE_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]


def family_hf(kind: str, **overrides):
    """A random 3-layer transformers model of the family with every feature on (a 3-entry layer_types where the
    family's test config gives one)."""
    types = {"layer_types": THREE_TYPES} if "layer_types" in FAMILIES[kind] else {}
    return tiny_hf(kind, features=True, num_hidden_layers=3, **types | overrides)


def teacher_of(kind: str, tmp_path, **overrides):
    """(transformers model, our Decoder) on the same weights."""
    hf = family_hf(kind, **overrides)
    return hf, load_decoder(save_hf(hf, tmp_path / kind))


def saved_and_loaded(model, path):
    """model saved by us, read back by transformers' own class."""
    path.mkdir()
    save_decoder(model, path)
    return load_hf(path)


def load_hf(path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.config._attn_implementation = "eager"  # the soft-capping families need it
    return hf


def hf_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind", FAMILIES)
def test_pruned_family_loads_in_its_own_class_with_our_logits(kind, tmp_path):
    hf, model = teacher_of(kind, tmp_path)
    ids = torch.randint(0, 256, (2, 10))
    imp = activation_importance(model, ids, batch=2)
    imp.layers = torch.tensor([1.0, 0.0, 2.0])  # layer 1 goes: the layers after it keep their own attention types
    keep = select(imp, Shape.of(model.cfg), SHAPE)
    pruned = prune(model, keep, SHAPE)
    back = saved_and_loaded(pruned, tmp_path / "pruned")
    assert type(back) is type(hf) and back.config.model_type == kind
    assert (back.config.hidden_size, back.config.intermediate_size, back.config.num_hidden_layers) == (32, 96, 2)
    assert (back.config.num_attention_heads, back.config.num_key_value_heads) == (2, 1)
    if model.cfg.layer_types is not None:
        assert list(back.config.layer_types) == [model.cfg.layer_types[0], model.cfg.layer_types[2]]
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, pruned(ids), atol=1e-4, rtol=0)
    assert param_count(model.cfg, SHAPE) == hf_params(back)


@pytest.mark.parametrize("kind", FAMILIES)
def test_full_size_is_the_identity_and_a_dropped_layer_is_skipped(kind, tmp_path):
    _, model = teacher_of(kind, tmp_path)
    ids, full = torch.randint(0, 256, (2, 10)), Shape.of(model.cfg)
    with torch.no_grad():
        assert torch.equal(prune(model, select(random_importance(model, 0), full, full), full)(ids), model(ids))
        imp = random_importance(model, 0)
        imp.layers = torch.tensor([1.0, 0.0, 2.0])
        shallower = Shape(**{**full.__dict__, "num_layers": 2})
        pruned = prune(model, select(imp, full, shallower), shallower)
        skip = model.model.layers[1].register_forward_hook(lambda module, args, out: args[0])
        try:
            torch.testing.assert_close(pruned(ids), model(ids), atol=1e-5, rtol=0)
        finally:
            skip.remove()


@pytest.mark.parametrize("kind", FAMILIES)
def test_kept_heads_and_neurons_compute_what_they_computed(kind, tmp_path):
    """At full hidden width and depth, the pruned model is the teacher with the dropped heads' and neurons' outputs
    zeroed: each kept row of q, k, v (fused or not), gate and up met its own. Norms over the whole q/k projection
    (OLMo 2) see fewer heads, so there only the neurons are exact."""
    _, model = teacher_of(kind, tmp_path)
    full, per_proj = Shape.of(model.cfg), model.cfg.arch.qk_norm == "proj"
    shape = Shape(full.hidden_size, 96, *((4, 2) if per_proj else (2, 1)), full.num_layers)
    keep = select(random_importance(model, 5), full, shape)
    ids, D = torch.randint(0, 256, (2, 10)), model.cfg.head_dim
    with torch.no_grad():
        pruned = prune(model, keep, shape)
        for block, heads, neurons in zip(model.model.layers, keep.heads, keep.neurons):
            block.self_attn.o_proj.weight[:, [r for r in range(4 * D) if r // D not in heads]] = 0
            block.mlp.down_proj.weight[:, [n for n in range(128) if n not in neurons]] = 0
        torch.testing.assert_close(pruned(ids), model(ids), atol=1e-5, rtol=0)


def test_phi3_longrope_keeps_hidden_per_head():
    """transformers' Phi-3 config checks longrope's factor lists against hidden_size // num_heads: refused in one line."""
    from compress.errors import UserError
    from compress.model.config import ModelConfig
    from compress.prune.shape import candidates, validate

    cfg = ModelConfig.from_hf(family_hf("phi3").config.to_dict())
    with pytest.raises(UserError, match=r"^--hidden-size 48 with --num-heads 2: .* use --hidden-size 32$"):
        validate(cfg, Shape(48, 96, 2, 1, 2))
    assert all(s.hidden_size == 64 for s, _ in candidates(cfg, param_count(cfg, Shape(64, 64, 4, 2, 3))))


@pytest.mark.parametrize("kind", FAMILIES)
def test_param_count_is_transformers(kind):
    from compress.model.config import ModelConfig

    hf = family_hf(kind)
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    assert param_count(cfg, Shape.of(cfg)) == hf_params(hf)


@pytest.mark.parametrize("kind", ["gemma2", "gemma3_text"])
def test_scaled_embeddings_keep_their_values_when_tied(kind, tmp_path):
    """Gemma scales embeddings by sqrt(hidden_size): the narrower table takes the difference, and the final norm
    gives it back to the tied lm_head."""
    hf, model = teacher_of(kind, tmp_path, tie_word_embeddings=True)
    keep = select(random_importance(model, 3), Shape.of(model.cfg), SHAPE)
    pruned = prune(model, keep, SHAPE)
    ids, c = torch.randint(0, 256, (2, 10)), keep.channels
    with torch.no_grad():
        torch.testing.assert_close(pruned.embed(ids), model.embed(ids)[..., c])
        out = (1 + pruned.model.norm.weight) * pruned.lm_head.weight
        torch.testing.assert_close(out, ((1 + model.model.norm.weight) * model.lm_head.weight)[:, c])
    back = saved_and_loaded(pruned, tmp_path / "pruned")
    assert back.config.tie_word_embeddings and param_count(model.cfg, SHAPE) == hf_params(back)
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, pruned(ids), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["phi3", "gemma3_text"])
def test_pruned_family_distills(kind, tmp_path):
    from compress.prune.config import DistillConfig
    from compress.prune.distill import Distiller

    _, model = teacher_of(kind, tmp_path)
    student = prune(model, select(random_importance(model, 0), Shape.of(model.cfg), SHAPE), SHAPE)
    rows = torch.randint(0, 256, (24, 16), generator=torch.Generator().manual_seed(0))
    cfg = DistillConfig(tokens=3 * 4 * 16, seq_len=16, batch_size=4, lr=3e-3, eval_every=1000, save_every=1000,
                        hidden_weight=0.5)
    run = Distiller(model, student, rows[:16], rows[16:], cfg, tmp_path / "ckpt")
    curve = run.run()
    assert [p["step"] for p in curve] == [0, 1, 2, 3] and all(p["kd_loss"] > 0 for p in curve[1:])
    trained = run.trained_decoder()
    ids = rows[:2]
    with torch.no_grad():
        torch.testing.assert_close(saved_and_loaded(trained, tmp_path / "student")(ids).logits, trained(ids), atol=1e-4, rtol=0)


def test_prune_distill_of_a_gemma3_checkpoint(tmp_path, smollm2_dir):
    """The public prune-distill on a tied Gemma 3 checkpoint with a tokenizer: C4 importance, a layer of three
    dropped, two steps; OUT is a Gemma3ForCausalLM with the kept layers' types and our logits."""
    from compress.commands.prune_distill import run_prune_distill
    from compress.prune.config import DistillConfig, PruneConfig
    from tests.conftest import read_json

    src = save_hf(family_hf("gemma3_text", vocab=49152, tie_word_embeddings=True), tmp_path / "src", smollm2_dir)
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(60)))
    pcfg = PruneConfig(hidden_size=32, intermediate_size=96, num_heads=2, num_kv_heads=1, num_layers=2, calib_samples=2,
                       calib_seq_len=16)
    dcfg = DistillConfig(tokens=2 * 2 * 16, seq_len=16, batch_size=2, eval_rows=2, data=str(text))
    out = run_prune_distill(str(src), pcfg, dcfg, str(tmp_path / "out"))
    doc = read_json(out / "compress.json")
    assert [p["step"] for p in doc["distill_curve"]] == [0, 1, 2]
    back, ours = load_hf(out), load_decoder(out)
    assert type(back).__name__ == "Gemma3ForCausalLM" and back.config.tie_word_embeddings
    assert list(back.config.layer_types) == [THREE_TYPES[i] for i in doc["keep"]["layers"]]
    assert doc["params"]["after"] == hf_params(back)
    ids = torch.randint(0, 49152, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, ours(ids), atol=1e-4, rtol=0)
