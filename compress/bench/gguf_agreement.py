"""Where our engine and llama.cpp part on one GGUF file, and by how much: our greedy continuation of each README
prompt (gguf_compare.PROMPTS), then llama.cpp's logits along the same tokens (teacher-forced, one eval of prompt
and continuation). Per output position: our top-two logprob margin, llama.cpp's, the largest difference between the
two engines' logprobs of our top 3 tokens, and where llama.cpp's argmax is another token. A greedy parting where
both margins are below that difference is a near-tie under the engines' different arithmetic; one where they
are not would be a bug. Beside them, llama.cpp against itself: its greedy continuation with the prompt evaluated as
one batch and one token at a time (other kernels, other sums), and its logprobs' difference at the prompt's end:
the agreement one engine has with itself on the file.

    python -m compress.bench.gguf_agreement FILE.gguf --tokenizer smollm2-135m [--max-tokens 16]
"""

import click
import numpy as np
import torch

from compress import models
from compress.bench import llamacpp_files
from compress.bench.gguf_compare import PROMPTS


def ours(llm, prompt: list[int], max_tokens: int) -> tuple[list[int], list]:
    """Our greedy ids and their TokenLogprobs (top 3) for one prompt."""
    from compress.runtime.sequence import SamplingParams

    seq = llm.make_sequence(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=3))
    llm.enqueue(seq)
    while not seq.finished:
        llm.step()
    return seq.output_token_ids, seq.logprobs


def lines(prompt: str, out: list[int], logprobs: list, theirs: torch.Tensor) -> list[str]:
    """theirs [N, V]: llama.cpp's logprobs at the positions that predicted out."""
    rows, worst = [], 0.0
    for i, (t, lp) in enumerate(zip(out, logprobs)):
        top = theirs[i].topk(2)
        diff = max(abs(theirs[i, tid].item() - v) for tid, v in lp.top)
        worst = max(worst, diff)
        parts = "" if top.indices[0].item() == t else f"  <- llama.cpp: {top.indices[0].item()}"
        rows.append(f"  {i:2d} ours {t:6d}  margin ours {lp.top[0][1] - lp.top[1][1]:.4f} llama.cpp "
                    f"{(top.values[0] - top.values[1]).item():.4f}  |d logprob| {diff:.4f}{parts}")
    first = next((i for i, r in enumerate(rows) if "<-" in r), len(rows))
    return [f"{prompt!r}: equal for {first}/{len(out)} tokens, max |d logprob| of our top 3: {worst:.4f}", *rows]


def llama_greedy(llama, ids: list[int], max_tokens: int, batched: bool) -> tuple[list[int], torch.Tensor]:
    """llama.cpp's greedy ids after ``ids`` and its logprobs [V] at the prompt's end, the prompt evaluated as one batch
    or one token at a time."""
    llama.reset()
    for chunk in [ids] if batched else [[t] for t in ids]:
        llama.eval(chunk)
    first = torch.from_numpy(np.array(llama.scores[len(ids) - 1], dtype=np.float32)).log_softmax(-1)
    out = []
    for _ in range(max_tokens):
        out.append(int(np.argmax(llama.scores[llama.n_tokens - 1])))
        llama.eval([out[-1]])
    return out, first


def itself(prompt: str, llama, ids: list[int], max_tokens: int) -> str:
    """One line: llama.cpp's agreement with itself on this prompt (batched against token by token)."""
    (a, la), (b, lb) = (llama_greedy(llama, ids, max_tokens, batched) for batched in (True, False))
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    top = la.topk(3).indices
    return (f"{prompt!r}: llama.cpp against itself (prompt batched / one token at a time): equal for {same}/{len(a)} "
            f"tokens, max |d logprob| of its top 3 at the prompt's end: {(la[top] - lb[top]).abs().max().item():.4f}")


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", "tokenizer_of", default=models.DEFAULT_MODEL, show_default=True,
              help="the model whose tokenizer makes the prompts' ids")
@click.option("--max-tokens", default=16, show_default=True)
def main(path, tokenizer_of, max_tokens):
    from compress.runtime.engine import LLM

    llama = llamacpp_files.load(path, 256, torch.get_num_threads(), logits_all=True)
    tokenizer = models.load_tokenizer(models.resolve(tokenizer_of))
    llm = LLM(path)
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        out, logprobs = ours(llm, ids, max_tokens)
        llama.reset()
        llama.eval(ids + out)
        scores = np.array(llama.scores[len(ids) - 1: len(ids) + len(out) - 1], dtype=np.float32)
        print("\n".join(lines(prompt, out, logprobs, torch.from_numpy(scores).log_softmax(-1))), flush=True)
        print(itself(prompt, llama, ids, max_tokens), flush=True)


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
