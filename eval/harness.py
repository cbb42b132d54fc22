"""lm-eval runs: the model wrapper for each backend, MMLU from the local task, and pass-through tasks."""

from pathlib import Path

from compress.errors import UserError
from compress.eval import mmlu
from compress.model.load import read_config

HF_LOADABLE = (None, "compressed-tensors")  # quant_method values transformers loads without extra packages


def make_lm(backend: str, model_dir: Path, batch_size: int = 1):
    """An lm-eval LM for one model: our engine (`compress`) or lm-eval's HFLM on transformers (`hf`)."""
    if backend == "compress":
        from compress.eval.lm_backend import CompressLM

        return CompressLM(str(model_dir))
    method = read_config(model_dir).get("quantization_config", {}).get("quant_method")
    if method not in HF_LOADABLE:
        raise UserError(f"{model_dir}: transformers cannot load quant_method '{method}'; use --backend compress")
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(model_dir), dtype="float32", device="cpu", batch_size=batch_size)


def check_tasks(names: list[str]) -> None:
    """Fail early, in one line, on a task name lm-eval does not know."""
    if not names:
        return
    from lm_eval.tasks import TaskManager

    manager = TaskManager()
    known = set(manager.all_tasks)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"unknown task {', '.join(unknown)}: use wikitext, mmlu or an lm-eval task name "
                        f"(`lm-eval ls tasks`) whose data is available offline")
    check_offline_data(names, manager)


def check_offline_data(names: list[str], manager) -> None:
    """Load each task's data now (from the datasets cache): a task whose data is not on this machine fails in one line."""
    from lm_eval.tasks import get_task_dict

    for name in names:
        try:
            get_task_dict([name], manager)
        except (ConnectionError, FileNotFoundError) as e:  # datasets' answer when the hub cannot be reached (offline)
            raise UserError(f"the data of task {name} is not available offline ({str(e).splitlines()[0]}); run once with "
                            f"network access and COMPRESS_ALLOW_DOWNLOAD=1 (HF_DATASETS_OFFLINE unset or 0) to download it "
                            f"into the datasets cache, or pre-download it there with datasets.load_dataset") from None


def run_mmlu(lm, num_fewshot: int, limit: int | None, subjects: list[str] | None = None) -> dict:
    """Accuracy per subject, per group and overall (micro and macro, with stderr)."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    # The local tasks are whole configs: skip indexing lm-eval's ~10k task files (seconds per call).
    out = simple_evaluate(model=lm, tasks=mmlu.tasks(subjects), num_fewshot=num_fewshot, limit=limit,
                          bootstrap_iters=0, log_samples=False, task_manager=TaskManager(include_defaults=False))
    per_subject = {}
    for name, metrics in out["results"].items():
        subject = name.removeprefix(mmlu.TASK_PREFIX)
        per_subject[subject] = {"acc": metrics["acc,none"], "n": out["n-samples"][name]["effective"]}
    return {"subjects": per_subject, **mmlu.summarize(per_subject)}


def run_tasks(lm, names: list[str], num_fewshot: int | None, limit: int | None) -> dict:
    """Other lm-eval tasks by name; their metrics as lm-eval reports them."""
    from lm_eval import simple_evaluate

    out = simple_evaluate(model=lm, tasks=names, num_fewshot=num_fewshot, limit=limit, bootstrap_iters=0,
                          log_samples=False)
    return {name: {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
            for name, metrics in out["results"].items()}
