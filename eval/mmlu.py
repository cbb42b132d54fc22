"""MMLU from the local CSVs as lm-eval tasks: the standard template, 57 subjects in 4 groups.

The task configs mirror lm-eval's own `mmlu` (tasks/mmlu/default): dev is the few-shot pool
(first_n), test is evaluated, choices " A".." D" are scored by log-likelihood. Only the data
source differs: `$COMPRESS_DATA_DIR/mmlu/data/{dev,test}/<subject>_<split>.csv`, read here, so
nothing is fetched from a hub.
"""

import csv
import logging
import math
from pathlib import Path

from compress.data import data_dir
from compress.errors import UserError

LETTERS = ("A", "B", "C", "D")
GROUPS = ("stem", "humanities", "social_sciences", "other")
SUBJECTS = {  # subject -> group, as lm-eval's tasks/mmlu/_generate_configs.py
    "abstract_algebra": "stem", "anatomy": "stem", "astronomy": "stem", "business_ethics": "other",
    "clinical_knowledge": "other", "college_biology": "stem", "college_chemistry": "stem",
    "college_computer_science": "stem", "college_mathematics": "stem", "college_medicine": "other",
    "college_physics": "stem", "computer_security": "stem", "conceptual_physics": "stem",
    "econometrics": "social_sciences", "electrical_engineering": "stem", "elementary_mathematics": "stem",
    "formal_logic": "humanities", "global_facts": "other", "high_school_biology": "stem",
    "high_school_chemistry": "stem", "high_school_computer_science": "stem",
    "high_school_european_history": "humanities", "high_school_geography": "social_sciences",
    "high_school_government_and_politics": "social_sciences", "high_school_macroeconomics": "social_sciences",
    "high_school_mathematics": "stem", "high_school_microeconomics": "social_sciences",
    "high_school_physics": "stem", "high_school_psychology": "social_sciences", "high_school_statistics": "stem",
    "high_school_us_history": "humanities", "high_school_world_history": "humanities", "human_aging": "other",
    "human_sexuality": "social_sciences", "international_law": "humanities", "jurisprudence": "humanities",
    "logical_fallacies": "humanities", "machine_learning": "stem", "management": "other", "marketing": "other",
    "medical_genetics": "other", "miscellaneous": "other", "moral_disputes": "humanities",
    "moral_scenarios": "humanities", "nutrition": "other", "philosophy": "humanities", "prehistory": "humanities",
    "professional_accounting": "other", "professional_law": "humanities", "professional_medicine": "other",
    "professional_psychology": "social_sciences", "public_relations": "social_sciences",
    "security_studies": "social_sciences", "sociology": "social_sciences", "us_foreign_policy": "social_sciences",
    "virology": "other", "world_religions": "humanities",
}
TEMPLATE = "{{question.strip()}}\nA. {{choices[0]}}\nB. {{choices[1]}}\nC. {{choices[2]}}\nD. {{choices[3]}}\nAnswer:"
TASK_PREFIX = "mmlu_local_"


def mmlu_dir() -> Path:
    root = data_dir() / "mmlu" / "data"
    if not (root / "test").is_dir():
        raise UserError(f"MMLU data not found at {root}: set COMPRESS_DATA_DIR to the shared data folder "
                        f"(the one holding mmlu/data/{{dev,test}})")
    return root


def read_split(root: Path, subject: str, split: str) -> list[dict]:
    """Rows as lm-eval's cais/mmlu docs: question, choices (4 strings), answer (index)."""
    path = root / split / f"{subject}_{split}.csv"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if any(len(r) != 6 or r[5] not in LETTERS for r in rows):
        raise UserError(f"{path} is not an MMLU CSV (question, A, B, C, D, answer letter per row)")
    return [{"question": r[0], "subject": subject, "choices": r[1:5], "answer": LETTERS.index(r[5])} for r in rows]


def load_subject(subject: str, root: str, **_metadata):
    """lm-eval's custom_dataset hook: a DatasetDict with the dev and test splits of one subject."""
    from datasets import Dataset, DatasetDict

    return DatasetDict({split: Dataset.from_list(read_split(Path(root), subject, split)) for split in ("dev", "test")})


def task_config(subject: str, root: Path) -> dict:
    return {
        "task": TASK_PREFIX + subject,
        "task_alias": subject,
        "custom_dataset": load_subject,
        "dataset_kwargs": {"subject": subject, "root": str(root)},
        "test_split": "test",
        "fewshot_split": "dev",
        "fewshot_config": {"sampler": "first_n"},
        "output_type": "multiple_choice",
        "description": f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n",
        "doc_to_text": TEMPLATE,
        "doc_to_choice": list(LETTERS),
        "doc_to_target": "answer",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1.0},
    }


def tasks(subjects: list[str] | None = None) -> list:
    """One lm-eval ConfigurableTask per subject (all 57 by default)."""
    from lm_eval.api.task import ConfigurableTask

    root = mmlu_dir()
    log = logging.getLogger("lm_eval.api.task")
    level = log.level
    log.setLevel(logging.ERROR)  # lm-eval warns once per custom_dataset task that kwargs could be passed; 57 times
    try:
        return [ConfigurableTask(config=task_config(s, root)) for s in subjects or SUBJECTS]
    finally:
        log.setLevel(level)


def accuracy(rows: list[tuple[float, int]]) -> dict:
    """Micro (pooled over questions) and macro (mean over members) accuracy with stderr.
    rows: (accuracy, number of questions) per member."""
    n = sum(c for _, c in rows)
    micro = sum(a * c for a, c in rows) / n
    macro = sum(a for a, _ in rows) / len(rows)
    macro_se = math.sqrt(sum(a * (1 - a) / max(c - 1, 1) for a, c in rows)) / len(rows)
    return {"acc": micro, "acc_stderr": math.sqrt(micro * (1 - micro) / max(n - 1, 1)),
            "acc_macro": macro, "acc_macro_stderr": macro_se, "n": n}


def summarize(per_subject: dict[str, dict]) -> dict:
    """per_subject: subject -> {"acc", "n"}; returns overall and per-group micro/macro accuracy with stderr."""
    out = {"all": accuracy([(r["acc"], r["n"]) for r in per_subject.values()])}
    for group in GROUPS:
        members = [(r["acc"], r["n"]) for s, r in per_subject.items() if SUBJECTS[s] == group]
        if members:
            out[group] = accuracy(members)
    return out
