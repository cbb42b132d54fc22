"""The local MMLU task: data, the prompt, group arithmetic; both backends agree on a tiny model."""

import pytest

from compress.eval import mmlu

# The 1-shot prompt of the first anatomy test question: lm-eval's MMLU template, the first dev question as the shot.
EXPECTED_1SHOT = (
    "The following are multiple choice questions (with answers) about anatomy.\n\n"
    "What is the embryological origin of the hyoid bone?\nA. The first pharyngeal arch\n"
    "B. The first and second pharyngeal arches\nC. The second pharyngeal arch\n"
    "D. The second and third pharyngeal arches\nAnswer: D\n\n"
    "A lesion causing compression of the facial nerve at the stylomastoid foramen will cause ipsilateral\n"
    "A. paralysis of the facial muscles.\nB. paralysis of the facial muscles and loss of taste.\n"
    "C. paralysis of the facial muscles, loss of taste and lacrimation.\n"
    "D. paralysis of the facial muscles, loss of taste, lacrimation and decreased salivation.\nAnswer:"
)


def requests(subject: str, num_fewshot: int, limit: int):
    [task] = mmlu.tasks([subject])
    task.set_config("num_fewshot", num_fewshot)
    task.build_all_requests(limit=limit, rank=0, world_size=1)
    return task.instances


def test_all_subjects_load_with_the_published_counts(data_dir):
    root = mmlu.mmlu_dir()
    assert len(mmlu.SUBJECTS) == 57 and set(mmlu.SUBJECTS.values()) == set(mmlu.GROUPS)
    assert sum(len(mmlu.read_split(root, s, "test")) for s in mmlu.SUBJECTS) == 14042
    assert sum(len(mmlu.read_split(root, s, "dev")) for s in mmlu.SUBJECTS) == 285


def test_prompt_equals_the_checked_in_string(data_dir):
    instances = requests("anatomy", 1, 1)
    assert [i.args for i in instances] == [(EXPECTED_1SHOT, f" {c}") for c in "ABCD"]
    assert instances[0].doc["answer"] == 0


def test_group_accuracy_is_micro_and_macro():
    per_subject = {"anatomy": {"acc": 0.5, "n": 100}, "astronomy": {"acc": 1.0, "n": 300}, "virology": {"acc": 0.25, "n": 4}}
    out = mmlu.summarize(per_subject)
    assert out["stem"]["acc"] == pytest.approx((50 + 300) / 400)
    assert out["stem"]["acc_macro"] == pytest.approx(0.75)
    assert out["all"]["n"] == 404 and out["other"]["acc"] == 0.25
    assert out["stem"]["acc_stderr"] == pytest.approx((0.875 * 0.125 / 399) ** 0.5)
    assert "humanities" not in out


def test_missing_data_dir_says_where_it_looked(monkeypatch, tmp_path):
    from compress.errors import UserError

    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match="COMPRESS_DATA_DIR"):
        mmlu.mmlu_dir()


def test_both_backends_give_the_same_loglikelihoods(data_dir, tiny_dir, monkeypatch, tmp_path):
    from lm_eval.models.huggingface import HFLM

    from compress.eval.lm_backend import CompressLM

    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    reqs = requests("anatomy", 2, 3) + requests("virology", 0, 3)
    ours = CompressLM(str(tiny_dir)).loglikelihood(reqs, disable_tqdm=True)
    theirs = HFLM(pretrained=str(tiny_dir), dtype="float32", device="cpu", batch_size=4).loglikelihood(reqs, disable_tqdm=True)
    assert [lp for lp, _ in ours] == pytest.approx([lp for lp, _ in theirs], abs=1e-4)
    assert [g for _, g in ours] == [g for _, g in theirs]


def test_scores_are_cached_so_an_interrupted_eval_resumes(data_dir, tiny_dir, monkeypatch, tmp_path):
    from compress.eval.lm_backend import CompressLM

    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    reqs = requests("virology", 1, 2)
    first = CompressLM(str(tiny_dir)).loglikelihood(reqs, disable_tqdm=True)
    again = CompressLM(str(tiny_dir))
    monkeypatch.setattr(again.llm, "step", lambda: pytest.fail("a cached score was computed again"))
    assert again.loglikelihood(reqs, disable_tqdm=True) == first


def test_one_token_answers_are_one_request_per_question(data_dir, tiny_dir, monkeypatch, tmp_path):
    from compress.eval.lm_backend import CompressLM

    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    lm = CompressLM(str(tiny_dir), cache=False)
    prompts = []
    make = lm.llm.make_sequence
    monkeypatch.setattr(lm.llm, "make_sequence", lambda ids, params: prompts.append(ids) or make(ids, params))
    reqs = requests("anatomy", 1, 3)  # 3 questions x 4 answers " A".." D", one token each
    scores = lm.loglikelihood(reqs, disable_tqdm=True)
    assert len(prompts) == 3 and len(scores) == 12
    # The same numbers as scoring each answer as its own request (the path multi-token continuations take).
    single = CompressLM(str(tiny_dir), cache=False)
    items = [(ctx + cont, len(ctx)) for ctx, cont in (single._encode_pair(*r.args) for r in reqs)]
    assert all(len(whole) == start + 1 for whole, start in items)
    for j, (whole, start) in enumerate(items):
        single._submit(active := {}, items, j, [])
        while active:
            for out in single.llm.step():
                if out.finished:
                    seq = active.pop(out.request_id)[0]
                    lp = seq.prompt_logprobs[start]
                    assert scores[j][0] == pytest.approx(lp.logprob, abs=1e-5)
                    assert scores[j][1] == (lp.top[0][0] == lp.token_id)


def test_siblings_share_the_context_blocks(data_dir, tiny_dir, monkeypatch, tmp_path):
    from dataclasses import replace

    from compress.eval.lm_backend import CompressLM

    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    lm = CompressLM(str(tiny_dir), cache=False)
    # 5-shot contexts (many full blocks, shared by the 4 choices and both questions), answers made
    # several tokens long so that each is its own request
    reqs = [replace(r, arguments=(r.args[0], r.args[1] + " is the answer")) for r in requests("anatomy", 5, 2)]
    lm.loglikelihood(reqs, disable_tqdm=True)
    blocks = lm.llm.blocks
    assert blocks.num_prefix_hits > 2 * blocks.num_allocated
