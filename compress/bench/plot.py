"""The plot of `compress bench --plot PATH`: decode throughput vs batch size, with the roofline bounds drawn."""

from pathlib import Path

from compress.eval.report import pyplot


def plot_throughput(results: list[list[dict]], gpu: str, path: Path) -> None:
    """Per model: measured decode tok/s (points), this machine's bound (dashed), the GPU's bound (dotted); log axes."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, rows in enumerate(results):
        color, name, batch = f"C{i}", rows[0]["name"], [r["batch"] for r in rows]
        ax.plot(batch, [r["decode_tok_s"] for r in rows], "o-", color=color, label=f"{name}: measured")
        ax.plot(batch, [r["bound"] for r in rows], "--", color=color, label=f"{name}: memory bound here")
        ax.plot(batch, [r["gpu_bound"] for r in rows], ":", color=color, label=f"{name}: {gpu} bound")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batch, [str(b) for b in batch])
    ax.set_xlabel("batch size (requests decoded together)")
    ax.set_ylabel("decode tokens/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
