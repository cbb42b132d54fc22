"""The side-by-side report of `compress eval --report DIR`: report.md, report.json and two plots."""

import json
from pathlib import Path

from compress.eval.mmlu import GROUPS
from compress.outdir import staged

COLUMNS = ("all", *GROUPS)


def markdown_table(rows: list[dict]) -> str:
    """Size, perplexity and MMLU per group for each model, with deltas against the first row."""
    has_ppl, has_mmlu = "wikitext_ppl" in rows[0], "mmlu" in rows[0]
    head = ["model", "weights MiB"]
    head += ["wikitext2 ppl", "Δ ppl"] if has_ppl else []
    head += [f"MMLU {c.replace('_', ' ')}" for c in COLUMNS] + ["Δ MMLU"] if has_mmlu else []
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    base = rows[0]
    for r in rows:
        cells = [r["model"], f"{r['bytes'] / 2**20:.1f}"]
        if has_ppl:
            cells += [f"{r['wikitext_ppl']:.3f}", f"{r['wikitext_ppl'] - base['wikitext_ppl']:+.3f}"]
        if has_mmlu:
            m = r["mmlu"]
            cells += [f"{100 * m[c]['acc']:.2f} ± {100 * m[c]['acc_stderr']:.2f}" if c in m else "-" for c in COLUMNS]
            cells.append(f"{100 * (m['all']['acc'] - base['mmlu']['all']['acc']):+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_mmlu(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(rows)
    for i, r in enumerate(rows):
        accs = [100 * r["mmlu"].get(c, {}).get("acc", 0.0) for c in COLUMNS]
        ax.bar([x + i * width for x in range(len(COLUMNS))], accs, width, label=r["model"])
    ax.axhline(25, color="grey", linestyle=":", label="chance")
    ax.set_xticks([x + width * (len(rows) - 1) / 2 for x in range(len(COLUMNS))], [c.replace("_", " ") for c in COLUMNS])
    ax.set_ylabel("MMLU accuracy (%)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ppl_vs_bytes(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in rows:
        ax.scatter(r["bytes"] / 2**20, r["wikitext_ppl"])
        ax.annotate(r["model"], (r["bytes"] / 2**20, r["wikitext_ppl"]), fontsize="small")
    ax.set_xlabel("weights (MiB)")
    ax.set_ylabel("WikiText-2 perplexity")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(rows: list[dict], cfg, out: Path) -> None:
    """Written to a temporary directory and renamed into place; an existing report is replaced."""
    settings = {"tasks": cfg.tasks, "backend": cfg.backend, "num_fewshot": cfg.num_fewshot, "limit": cfg.limit,
                "seq_len": cfg.seq_len, "limit_tokens": cfg.limit_tokens}
    with staged(out, force=True) as tmp:
        (tmp / "report.json").write_text(json.dumps({"settings": settings, "models": rows}, indent=2))
        md = ["# compress eval report", "", "Settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()), "",
              markdown_table(rows), ""]
        if "mmlu" in rows[0]:
            plot_mmlu(rows, tmp / "mmlu_groups.png")
            md += ["![MMLU accuracy per group](mmlu_groups.png)", ""]
        if "wikitext_ppl" in rows[0]:
            plot_ppl_vs_bytes(rows, tmp / "ppl_vs_bytes.png")
            md += ["![perplexity vs weight bytes](ppl_vs_bytes.png)", ""]
        (tmp / "report.md").write_text("\n".join(md))
