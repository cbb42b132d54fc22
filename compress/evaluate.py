"""`compress eval`: run the requested tasks on each model, print a table, record the numbers."""

from compress import models
from compress.errors import UserError
from compress.manifest import record_quality

TASKS = ("wikitext",)


def model_bytes(path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def run_eval(names: list[str], tasks: list[str], seq_len: int, limit_tokens: int | None) -> list[dict]:
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise UserError(f"unknown task {', '.join(unknown)}: available are {', '.join(TASKS)}")
    from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens

    pcfg = PerplexityConfig(seq_len=seq_len, limit_tokens=limit_tokens)
    paths = [models.resolve(n) for n in names]  # every MODEL is checked before any work
    rows, tokens = [], None
    for name, path in zip(names, paths):
        model = models.load_model(path)
        if tokens is None:
            tokens = wikitext_tokens(models.load_tokenizer(path))
        ppl = perplexity(model, tokens, pcfg, desc=f"wikitext {name}")
        key = f"wikitext_ppl_seq{seq_len}" + (f"_first{limit_tokens}" if limit_tokens else "")
        record_quality(path, key, round(ppl, 4))
        rows.append({"model": name, "wikitext_ppl": ppl, "bytes": model_bytes(path)})
    print_table(rows, rows[0]["wikitext_ppl"])
    return rows


def print_table(rows: list[dict], base_ppl: float) -> None:
    print("| model | weights MiB | wikitext2 ppl | Δ vs first |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['bytes'] / 2**20:.1f} | {r['wikitext_ppl']:.3f} | {r['wikitext_ppl'] - base_ppl:+.3f} |")
