"""Our GGUF files against llama.cpp's own quantizer (and AutoRound's GGUF export) on one model, in one process.

For each type: (a) llama.cpp's quantizer from the F32 GGUF we write of the same weights, (b) our RTN and (c) our
AWQ into that type (also with --tune-iters' steps), (d) AutoRound's export where its venv exists
(compress/bench/autoround.py). Every file, and the F16 and F32 references, is scored twice on the same WikiText-2
windows: by llama.cpp itself (llama-cpp-python's logits) and by our engine reading the file (`compress eval
FILE.gguf`: the GGUF input path, which dequantizes to fp32). Sizes and quantize times beside them; then greedy
continuations of the README's prompts by both engines on each file.

    python -m compress.bench.gguf_compare smollm2-135m --out /tmp/gguf-cmp --types Q4_0,Q4_K_M,Q8_0
"""

import json
import time
from pathlib import Path

import click
import torch

from compress import models
from compress.bench import llamacpp_files
from compress.bench.scale_bench import cpu_info
from compress.commands.quantize_gguf import run_quantize_gguf
from compress.eval.perplexity import PerplexityConfig, perplexity, wikitext_tokens, windows
from compress.gguf.types import FILE_TYPES
from compress.quant.config import QuantConfig

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Water boils at")
REFERENCE = "F16"  # the gaps are to the F16 file, as llama.cpp users measure them


def ours(model: str, out: Path, method: str, gguf_type: str, tune_iters: int = 0) -> float:
    start = time.perf_counter()
    cfg = QuantConfig(method=method, format="gguf", gguf_type=gguf_type, tune_iters=tune_iters)
    run_quantize_gguf(model, cfg, str(out), force=True)
    return time.perf_counter() - start


def autoround(src: Path, tokenizer, out: Path, gguf_type: str, iters: int, nsamples: int, seqlen: int) -> float:
    from compress.bench import autoround as ar

    calib = ar.calibration_file(tokenizer, out.parent / "autoround-calib.jsonl", nsamples, seqlen)
    written, seconds = ar.run_autoround(src, out.parent / f".autoround-{gguf_type}", f"gguf:{gguf_type.lower()}", iters,
                                        nsamples, seqlen, calib)
    written.replace(out)
    return seconds


def our_perplexity(path: Path, wins: torch.Tensor) -> float:
    """Our engine's reading of the file (docs/gguf.md: an all-Q4_0 file keeps its codes, other types are
    dequantized), streamed block by block with fp32 activations as `compress eval` runs it."""
    model = models.open_model(models.resolve(str(path)))
    return perplexity(model, wins.flatten(), PerplexityConfig(seq_len=wins.shape[1]), desc=f"compress {path.name}")


def our_greedy(path: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from compress.runtime.engine import LLM
    from compress.runtime.sequence import SamplingParams

    llm = LLM(str(path))
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return [out.token_ids for out in llm.generate(prompts, params)]


class Files:
    """The files of one comparison under ``out``, with their quantize seconds in out/seconds.json and their
    perplexities in out/scores.json; ``reuse``: a file already there (from an earlier run of the same model) is kept
    with its recorded seconds, and a score on the same windows is not computed again (an interrupted run resumes)."""

    def __init__(self, out: Path, reuse: bool):
        self.out, self.log, self.scores_log = out, out / "seconds.json", out / "scores.json"
        self.seconds = json.loads(self.log.read_text()) if reuse and self.log.is_file() else {}
        self.scores = json.loads(self.scores_log.read_text()) if reuse and self.scores_log.is_file() else {}
        self.rows: list[dict] = []

    def score(self, row: dict, wins: torch.Tensor, threads: int) -> None:
        """row's ppl_llamacpp and ppl_ours on the windows [W, T], computed once per file and windows."""
        key = f"{row['path'].name} {wins.shape[0]}x{wins.shape[1]}"
        if key not in self.scores:
            self.scores[key] = [llamacpp_files.perplexity(row["path"], wins, threads), our_perplexity(row["path"], wins)]
            self.scores_log.write_text(json.dumps(self.scores, indent=1))
        row["ppl_llamacpp"], row["ppl_ours"] = self.scores[key]

    def add(self, gguf_type: str, by: str, name: str, make) -> None:
        path = self.out / name
        if name not in self.seconds or not path.is_file():
            self.seconds[name] = make(path)
            self.log.write_text(json.dumps(self.seconds, indent=1))
        self.rows.append({"type": gguf_type, "by": by, "path": path, "seconds": self.seconds[name]})


def files_of(model: str, files: Files, types: list[str], src: Path, tokenizer, ar_cfgs: list[dict], tune: list[int],
             threads: int) -> list[dict]:
    """Write every file; one row per file: type, who made it, path, quantize seconds. ``tune``: also our AWQ with
    that many --tune-iters steps, for each 4-bit type."""
    for ref in ("F32", "F16"):
        files.add(ref, "compress", f"{ref.lower()}.gguf", lambda path, ref=ref: ours(model, path, "rtn", ref))
    for t in types:
        files.add(t, "llama.cpp", f"llamacpp-{t}.gguf",
                  lambda path, t=t: llamacpp_files.quantize(files.out / "f32.gguf", path, t, threads))
        for m in (["int8"] if t == "Q8_0" else ["rtn", "awq"]):
            files.add(t, f"compress {m}", f"compress-{m}-{t}.gguf", lambda path, t=t, m=m: ours(model, path, m, t))
        for n in tune if FILE_TYPES[t].bits == 4 else []:
            files.add(t, f"compress awq tune {n}", f"compress-awq-tune{n}-{t}.gguf",
                      lambda path, t=t, n=n: ours(model, path, "awq", t, n))
        for cfg in ar_cfgs if FILE_TYPES[t].bits == 4 else []:
            files.add(t, f"AutoRound iters {cfg['iters']}", f"autoround-{cfg['iters']}-{t}.gguf",
                      lambda path, t=t, cfg=cfg: autoround(src, tokenizer, path, t, **cfg))
    return files.rows


def table(rows: list[dict]) -> str:
    ref = next(r for r in rows if r["type"] == REFERENCE)
    sizes = {r["type"]: r["bytes"] for r in rows if r["by"] == "llama.cpp"}
    gaps = {r["type"]: r["ppl_llamacpp"] - ref["ppl_llamacpp"] for r in rows if r["by"] == "llama.cpp"}
    lines = ["| type | made by | MiB | size / llama.cpp's | quantize s | ppl (llama.cpp) | ppl (compress) | gap / llama.cpp's gap |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        gap = r["ppl_llamacpp"] - ref["ppl_llamacpp"]
        rel = f"{gap / gaps[r['type']]:.2f}" if r["type"] in gaps and gaps[r["type"]] > 0 else "-"
        size = f"{r['bytes'] / sizes[r['type']]:.4f}" if r["type"] in sizes else "-"
        lines.append(f"| {r['type']} | {r['by']} | {r['bytes'] / 2**20:.1f} | {size} | {r['seconds']:.1f} | "
                     f"{r['ppl_llamacpp']:.4f} | {r['ppl_ours']:.4f} | {rel} |")
    return "\n".join(lines)


def greedy_lines(rows: list[dict], tokenizer, max_tokens: int, threads: int) -> list[str]:
    prompts = [tokenizer(p).input_ids for p in PROMPTS]
    lines = []
    for r in rows:
        theirs = llamacpp_files.greedy(r["path"], prompts, max_tokens, threads)
        mine = our_greedy(r["path"], prompts, max_tokens)
        for p, a, b in zip(PROMPTS, theirs, mine):
            same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
            lines.append(f"{r['type']} {r['by']} | {p!r}: llama.cpp {tokenizer.decode(a)!r} | compress {tokenizer.decode(b)!r}"
                         f" | equal for {same}/{len(a)} tokens")
    return lines


def counts(text: str, option: str) -> list[int]:
    """Whole numbers from 'N,M' (an empty text: none)."""
    try:
        return [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: give whole numbers separated by commas", param_hint=option) from None


@click.command()
@click.argument("model")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="directory for the files (kept)")
@click.option("--types", default="Q4_0,Q4_K_M,Q8_0", show_default=True)
@click.option("--limit-tokens", default=40960, show_default=True, help="WikiText-2 tokens scored (whole windows)")
@click.option("--seq-len", default=2048, show_default=True)
@click.option("--autoround-iters", default="", help="also AutoRound's GGUF export at these iterations (e.g. 0,50; 0 is its RTN mode)")
@click.option("--autoround-samples", default=128, show_default=True)
@click.option("--autoround-seqlen", default=512, show_default=True)
@click.option("--tune-iters", default="", help="also our AWQ with these --tune-iters steps (e.g. 50,200)")
@click.option("--max-tokens", default=24, show_default=True, help="greedy tokens per README prompt")
@click.option("--reuse", is_flag=True, help="keep the files an earlier run wrote under --out (and their seconds)")
def main(model, out, types, limit_tokens, seq_len, autoround_iters, autoround_samples, autoround_seqlen, tune_iters, max_tokens,
         reuse):
    types = [t.strip() for t in types.split(",")]
    bad = [t for t in types if t not in FILE_TYPES or not FILE_TYPES[t].quantized]
    if bad:
        raise click.BadParameter(f"{', '.join(bad)}: give quantized types of {', '.join(FILE_TYPES)}", param_hint="--types")
    llamacpp_files.import_llama_cpp()
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    src = models.resolve(model)
    tokenizer = models.load_tokenizer(src)
    ar_cfgs = [{"iters": n, "nsamples": autoround_samples, "seqlen": autoround_seqlen}
               for n in counts(autoround_iters, "--autoround-iters")]
    tune = counts(tune_iters, "--tune-iters")
    cpu, flags = cpu_info()
    print(f"{model} on {cpu}; flags: {' '.join(flags)}; {threads} threads; {time.strftime('%Y-%m-%d')}", flush=True)
    files = Files(out, reuse)
    rows = files_of(model, files, types, src, tokenizer, ar_cfgs, tune, threads)
    wins = windows(wikitext_tokens(tokenizer), PerplexityConfig(seq_len=seq_len, limit_tokens=limit_tokens))  # [W, T]
    for r in rows:
        r["bytes"] = r["path"].stat().st_size
        files.score(r, wins, threads)
        print(f"{r['type']} {r['by']}: llama.cpp {r['ppl_llamacpp']:.4f}, compress {r['ppl_ours']:.4f}", flush=True)
    print(f"\nWikiText-2 first {wins.numel()} tokens, {wins.shape[0]} windows of {seq_len}; gaps to the {REFERENCE} file\n")
    print(table(rows))
    print("\ngreedy, " + f"{max_tokens} tokens:")
    print("\n".join(greedy_lines(rows, tokenizer, max_tokens, threads)))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
