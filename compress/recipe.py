"""Recipe: a YAML pipeline of stages, read with line numbers and validated before any work starts.

    model: smollm2-135m          # the input model (`compress run --model` overrides it)
    minitron:                    # a stage: its name is its output folder, OUT/minitron/
      kind: prune-distill        # prune-distill | quantize | eval
      target_params: 95M         # every other key is a field of PruneConfig/DistillConfig,
      tokens: 30k                #   QuantConfig or EvalConfig, with the same name and type
    awq-int4:
      kind: quantize
      input: minitron            # default: the previous model stage, else `model`
      method: awq
    eval:
      kind: eval
      models: [model, minitron, awq-int4]   # default: `model` and every earlier model stage

Every error is one UserError line that starts with where the key was written: `FILE:LINE:` or
`--set:` (docs/recipes.md).
"""

import re
import types
import typing
from dataclasses import asdict, dataclass, fields
from difflib import get_close_matches
from pathlib import Path

import yaml

from compress.errors import UserError
from compress.commands.evaluate import EvalConfig
from compress.models import DEFAULT_MODEL
from compress.prune.config import DistillConfig, PruneConfig, parse_count
from compress.quant.config import QuantConfig

MODEL = "model"  # the top-level key naming the input model, and how stages refer to it
CONFIGS = {  # stage kind -> the dataclasses its keys fill, by manifest section name
    "prune-distill": {"prune": PruneConfig, "distill": DistillConfig},
    "quantize": {"quantize": QuantConfig},
    "eval": {"eval": EvalConfig},
}
STAGE_KEYS = {  # the keys of a stage that are not dataclass fields (besides `kind`), with their types
    "prune-distill": {"input": str, "distill": bool},  # distill: false only prunes
    "quantize": {"input": str},
    "eval": {"models": list[str]},
}
NOT_IN_RECIPES = {"report"}  # EvalConfig.report: an eval stage's folder is its report
COUNTS = {"target_params", "tokens"}  # also written as 95M, 30k
STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", list: "a list of strings"}


@dataclass
class Entry:
    """One value and where it was written: "FILE:LINE" or "--set"."""
    value: object
    where: str


@dataclass
class Stage:
    name: str
    kind: str
    configs: dict  # section name -> config dataclass (distill: None when `distill: false`)
    inputs: list[str]  # the models it reads: `model` or earlier stage names
    where: str  # "FILE:LINE" of the stage
    lines: dict[str, str]  # key -> where it was written

    def at(self, key: str) -> str:
        """The place to name in an error about ``key``: its own line, else the stage's."""
        return f"{self.lines.get(key, self.where)}: {self.name}.{key}"

    def section(self) -> dict:
        """The resolved settings, as recorded in compress.json and hashed for the skip check."""
        return {"kind": self.kind, "inputs": self.inputs,
                **{k: asdict(c) if c is not None else None for k, c in self.configs.items()}}


@dataclass
class Recipe:
    path: Path
    model: str
    model_where: str
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise UserError(f"--from {name}: no stage '{name}' in {self.path} (stages: {', '.join(s.name for s in self.stages)})")


def load_recipe(path: Path, model: str | None = None, sets: tuple[str, ...] = ()) -> Recipe:
    """Read, apply `--set stage.key=value` overrides and `--model`, validate; raises UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"recipe {path} not found")
    top, stages = read_yaml(path)
    for item in sets:
        apply_set(item, top, stages)
    if model is not None:
        top[MODEL] = Entry(model, "--model")
    return build(path, top, stages)


def read_yaml(path: Path) -> tuple[dict[str, Entry], dict[str, tuple[str, dict[str, Entry]]]]:
    """Top-level scalars, and each stage's entries in file order, every value with its line."""
    try:
        loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"recipe {path} is not a UTF-8 text file ({e.reason} at byte {e.start}); give a YAML recipe") from None
    try:
        root = loader.get_single_node()
        if not isinstance(root, yaml.MappingNode):
            raise UserError(f"{path}:1: a recipe is a mapping: `model:` and one section per stage")
        top, stages = {}, {}
        for key, where, node in pairs(loader, root, path, ""):
            if key == MODEL:
                top[key] = Entry(loader.construct_object(node, deep=True), where)
            elif isinstance(node, yaml.MappingNode):
                stages[key] = (where, {k: Entry(loader.construct_object(v, deep=True), w)
                                       for k, w, v in pairs(loader, node, path, f"{key}.")})
            else:
                raise UserError(f"{where}: {key}: a stage is a mapping with a `kind:` (prune-distill, quantize or eval)")
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", 0) + 1
        raise UserError(f"{path}:{line}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    finally:
        loader.dispose()
    return top, stages


def pairs(loader, node: yaml.MappingNode, path: Path, prefix: str) -> list[tuple[str, str, yaml.Node]]:
    """(key, "FILE:LINE" of the key, value node) for each entry; a key given twice is an error."""
    out = []
    for k, v in node.value:
        key, where = loader.construct_object(k), f"{path}:{k.start_mark.line + 1}"
        if not isinstance(key, str):
            raise UserError(f"{where}: key {key!r} is not a name")
        if key in (seen[0] for seen in out):
            raise UserError(f"{where}: {prefix}{key}: duplicate key")
        out.append((key, where, v))
    return out


def apply_set(item: str, top: dict, stages: dict) -> None:
    """`--set model=PATH` or `--set STAGE.KEY=VALUE` (VALUE read as YAML: 3, true, [wikitext, mmlu])."""
    key, eq, text = item.partition("=")
    if not eq:
        raise UserError(f"--set: '{item}' is not KEY=VALUE (e.g. --set awq-int4.bits=3)")
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        raise UserError(f"--set: {key}: '{text}' is not a YAML value") from None
    if key == MODEL:
        top[MODEL] = Entry(value, "--set")
        return
    stage, dot, field = key.partition(".")
    if not dot or not field:
        raise UserError(f"--set: '{key}' is not STAGE.KEY or model (e.g. --set awq-int4.bits=3)")
    if stage not in stages:
        raise UserError(f"--set: {key}: no stage '{stage}' in the recipe (stages: {', '.join(stages)})")
    stages[stage][1][field] = Entry(value, "--set")


def build(path: Path, top: dict[str, Entry], raw: dict[str, tuple[str, dict[str, Entry]]]) -> Recipe:
    model = top.get(MODEL, Entry(DEFAULT_MODEL, str(path)))
    if not isinstance(model.value, str) or not model.value:
        raise UserError(f"{model.where}: model: expected a model name or path, got {model.value!r}")
    if not raw:
        raise UserError(f"{path}:1: the recipe has no stages (sections with a `kind:`)")
    stages: list[Stage] = []
    for name, (where, entries) in raw.items():
        if not STAGE_NAME.fullmatch(name):
            raise UserError(f"{where}: {name}: a stage name is a folder name: letters, digits, '.', '_', '-'")
        stages.append(build_stage(name, where, dict(entries), stages, list(raw)))
    return Recipe(path, model.value, model.where, stages)


def build_stage(name: str, where: str, entries: dict[str, Entry], earlier: list[Stage], names: list[str]) -> Stage:
    kind = entries.pop("kind", Entry("nothing", where))
    if not isinstance(kind.value, str) or kind.value not in CONFIGS:
        raise UserError(f"{kind.where}: {name}.kind: expected one of {', '.join(CONFIGS)}, got {kind.value}")
    kind = kind.value
    classes = CONFIGS[kind]
    known = {f.name: f.type for cls in classes.values() for f in fields(cls) if f.name not in NOT_IN_RECIPES}
    known |= STAGE_KEYS[kind]
    for key, e in entries.items():
        if key not in known:
            near = get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]}?" if near else f"the keys are {', '.join(known)}"
            raise UserError(f"{e.where}: {name}.{key}: unknown key for kind {kind}; {hint}")
    values = {key: typed(f"{e.where}: {name}.{key}", key, e.value, known[key]) for key, e in entries.items()}
    ref = entries.get("models" if kind == "eval" else "input")
    inputs = stage_inputs(f"{ref.where if ref else where}: {name}", kind, ref and ref.value, earlier, names)
    configs = {}
    for section, cls in classes.items():
        try:
            configs[section] = cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})
        except UserError as e:
            raise located(name, where, entries, str(e)) from None
    if values.get("distill") is False:
        configs["distill"] = None
        extra = [k for k in entries if k in {f.name for f in fields(DistillConfig)} - {"seed"}]
        if extra:
            raise UserError(f"{entries[extra[0]].where}: {name}.{extra[0]}: a distillation setting, but `distill: false`")
    return Stage(name, kind, configs, inputs, where, {k: e.where for k, e in entries.items()})


def typed(where: str, key: str, value, hint):
    """``value`` checked against a dataclass field's annotation (int, float, bool, str, list[str], X | None)."""
    if key in COUNTS and isinstance(value, str):
        try:
            return parse_count(value)
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
    nullable = isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)
    if nullable:
        if value is None:
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    base = typing.get_origin(hint) or hint
    got = value
    if base is float and isinstance(value, str):  # YAML 1.1 reads 3e-4 as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, base) and (base is bool or not isinstance(value, bool))
    if not ok or base is list and not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: expected {TYPE_WORDS[base]}{' or null' if nullable else ''}, got {got!r}")
    return value


def stage_inputs(where: str, kind: str, refs, earlier: list[Stage], names: list[str]) -> list[str]:
    """The models a stage reads (`model` or earlier stage names), defaulted and checked."""
    producers = [s.name for s in earlier if s.kind != "eval"]
    key = "models" if kind == "eval" else "input"
    if refs is None:
        key += " (default: the previous model stage)" if kind != "eval" else ""
        refs = [MODEL, *producers] if kind == "eval" else (producers[-1] if producers else MODEL)
    refs = refs if kind == "eval" else [refs]
    if not refs or len(set(refs)) != len(refs):
        raise UserError(f"{where}.{key}: name each model to evaluate once, at least one")
    kinds = {s.name: s.kind for s in earlier}
    for ref in refs:
        if ref == MODEL:
            continue
        if ref not in kinds:
            problem = "is this stage or a later one; a stage reads earlier stages' outputs" if ref in names else \
                f"is not a stage (stages: {', '.join(names)}; `{MODEL}` is the input model)"
            raise UserError(f"{where}.{key}: '{ref}' {problem}")
        if kinds[ref] == "eval":
            raise UserError(f"{where}.{key}: '{ref}' is an eval stage; it writes a report, not a model")
        if kinds[ref] == "quantize" and kind != "eval":
            raise UserError(f"{where}.{key}: '{ref}' is quantized; {kind} needs an unquantized model (quantize last)")
    return refs


def located(stage: str, where: str, entries: dict[str, Entry], message: str) -> UserError:
    """A dataclass's own error with its `--flag` names as recipe keys, placed at the first key it names."""
    flag = re.compile(r"--([a-z][a-z0-9-]*)")
    key = next((k for k in (m.replace("-", "_") for m in flag.findall(message)) if k in entries), None)
    message = flag.sub(lambda m: m.group(1).replace("-", "_"), message)
    return UserError(f"{entries[key].where}: {stage}.{key}: {message}" if key else f"{where}: {stage}: {message}")
