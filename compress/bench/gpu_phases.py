"""The phases of `compress.bench.gpu_check`, each run by it in a process of its own:

    python -m compress.bench.gpu_phases PHASE --work DIR [--dry-run] [--llmc-model M]

A phase writes DIR/phases/PHASE.json as it goes (status "running"), then at its end (status "ok",
"fail" or "skipped"): one stopped at its time limit still leaves what it had measured. The
packages the H200 machine lacks (MISSING) are made unimportable first, so that the dry run fails
here where the GPU run would fail there. Models: DIR/tokenizer (synthetic_tokenizer), DIR/bf16
(random weights), DIR/int4 (`compress quantize --method rtn` of it).
"""

import argparse
import importlib.util
import json
import os
import platform
import random
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from xml.etree import ElementTree

import torch

from compress.bench import gpu_moe
from compress.bench.gpu_check import ROOT
from compress.bench.gpu_targets import PLANS
from compress.bench.synthetic_tokenizer import synthetic_tokenizer

MISSING = ("gguf", "datasets", "lm_eval", "fastapi", "uvicorn", "compressed_tensors")
NEEDED = ("click", "psutil", "pytest", "tqdm", "yaml", "tokenizers", "llmcompressor")  # the last for the optional phase
VERSIONS = ("torch", "triton", "transformers", "accelerate", "safetensors", "tokenizers")


@dataclass
class Ctx:
    work: Path
    dry_run: bool
    llmc_model: str | None = None

    def __post_init__(self):
        self.plan, self.device = PLANS[self.dry_run], "cpu" if self.dry_run else "cuda"


def env(ctx: Ctx, save) -> dict:
    versions = {name: metadata.version(name) if importlib.util.find_spec(name) else None for name in VERSIONS}
    gpu = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return dict(host=platform.node(), python=platform.python_version(), cpus=os.cpu_count(), versions=versions,
                cuda=torch.version.cuda, gpu=gpu.name if gpu else "none", gpu_memory_gib=gpu.total_memory / 2**30 if gpu else None,
                installed={m: importlib.util.find_spec(m) is not None for m in (*MISSING, *NEEDED)})


def cuda_tests(ctx: Ctx, save) -> dict:
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "mark.cuda" in p.read_text())
    if not files:
        return dict(status="skipped", note=f"no test file with a cuda mark under {ROOT / 'tests'}")
    xml = ctx.work / "cuda-tests.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files],
                          cwd=ROOT)  # its output goes to this phase's log
    suite = ElementTree.parse(xml).getroot().find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return dict(status="ok" if proc.returncode == 0 else "fail", files=files, failed=failed, **counts,
                passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"])


def kernel_ops(o: int, i: int, device, dtype) -> dict:
    """op -> (kernel fn(x), reference fn(x), weight bytes it reads), operands as compress/bench/operands.py draws them."""
    from compress.bench import triton_kernels as kb  # its dequant_matmul etc. are the Triton kernels' own wrappers (no dispatch)
    from compress.bench.operands import OUTLIERS, int8_operands, int_operands
    from compress.kernels import reference as ref

    ops = {}
    for bits in (4, 3):
        packed, scale, zero = int_operands(o, i, bits, device)
        a = (packed, scale.to(dtype), zero, bits)
        ops[f"int{bits}"] = (lambda x, a=a: kb.dequant_matmul(x, *a), lambda x, a=a: ref.dequant_matmul(x, *a),
                             (packed.numel() + zero.numel()) * 4 + scale.numel() * 2)
    a8 = int8_operands(o, i, device, dtype)
    for g in (0, 32):  # x's steps per token, and per token and 32 inputs (--act-group-size 32)
        ops["int8+outliers" + (f" g{g}" if g else "")] = (lambda x, g=g: kb.int8_outlier_matmul(x, *a8, act_group=g),
                                                            lambda x, g=g: ref.int8_outlier_matmul(x, *a8, act_group=g),
                                                            o * i + o * OUTLIERS * 2)
    a_fp8 = (torch.randn(o, i, device=device).to(torch.float8_e4m3fn), a8[1])
    ops["fp8"] = (lambda x: kb.fp8_matmul(x, *a_fp8), lambda x: ref.fp8_matmul(x, *a_fp8), o * i)
    return ops


def mismatch(y, expected) -> dict:
    """Max |kernel - reference| against the kernel tests' bound (tests/kernels/tolerance.py)."""
    from tests.kernels.tolerance import RELATIVE

    err = (y.float() - expected.float()).abs().max().item()
    bound = RELATIVE[expected.dtype] * expected.float().abs().max().item()
    return dict(err=err, bound=bound, match=y.shape == expected.shape and err <= bound)


def kernels(ctx: Ctx, save) -> dict:
    """Each kernel and torch's bf16 matmul on the same shapes, checked against reference.py; paged attention vs SDPA."""
    from compress.bench import triton_kernels as kb
    from compress.bench.operands import attention_operands
    from compress.kernels import reference as ref

    device, plan, rows = torch.device(ctx.device), ctx.plan, []
    peak = kb.peak_gbps(device)
    for model, shapes in plan.linear.items():
        for o, i, per_layer in shapes:
            w = torch.randn(o, i, device=device, dtype=torch.bfloat16)  # [O, I]
            ops = kernel_ops(o, i, device, torch.bfloat16)
            for m in plan.batch:
                x = torch.randn(m, i, device=device, dtype=torch.bfloat16)  # [M, I]
                base = kb.milliseconds(lambda: torch.matmul(x, w.t()))
                for name, (fn, ref_fn, weight_bytes) in ops.items():
                    check = mismatch(fn(x), ref_fn(x))
                    ms, nbytes = kb.milliseconds(lambda: fn(x)), weight_bytes + (m * i + m * o) * 2
                    rows.append(dict(op=name, model=model, shape=f"{o}x{i}", per_layer=per_layer, M=m, ms=ms, bf16_ms=base,
                                     bytes=nbytes, gbps=nbytes / ms / 1e6, **check))
            del w, ops
            save(dict(rows=rows, peak_gbps=peak, target_model=next(iter(plan.linear))))
            print(f"{model} {o}x{i}: done, {len(rows)} rows", flush=True)
    heads = plan.heads
    for seqs, context in plan.attention:
        args, k, v = attention_operands(seqs, context, *heads, device)
        q4 = args[0][:, :, None]  # [S, H, 1, D]
        base = kb.milliseconds(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True))
        ms = kb.milliseconds(lambda: kb.paged_attention(*args))
        nbytes = 2 * k.numel() * 2
        rows.append(dict(op="paged attention", model=f"H{heads[0]}/KV{heads[1]}/D{heads[2]}", shape=f"ctx {context}", per_layer=1,
                         M=seqs, ms=ms, bf16_ms=base, bytes=nbytes, gbps=nbytes / ms / 1e6,
                         **mismatch(kb.paged_attention(*args), ref.paged_attention(*args))))
    return dict(rows=rows, peak_gbps=peak, target_model=next(iter(plan.linear)))


def moe(ctx: Ctx, save) -> dict:
    """A tiny int4 MoE's greedy tokens, fused MoE kernel vs per-expert path; one Qwen3-30B-A3B layer timed both ways."""
    return gpu_moe.phase(ctx, synthetic_tokenizer(ctx.work / "tokenizer"), greedy, compare, save)


def checkpoint(ctx: Ctx, save) -> dict:
    """random_checkpoint's writer, its normal * 0.02 drawn on ctx.device: on one CPU core 8B draws take a minute."""
    from compress.bench import random_checkpoint as rc

    def draw(name: str, size: tuple, dtype, seed: int, norm_offset: float = 0.0):
        if name.endswith("norm.weight"):
            return torch.full(size, 1.0 - norm_offset, dtype=dtype)
        gen = torch.Generator(ctx.device).manual_seed(seed)
        return torch.randn(size, generator=gen, dtype=dtype, device=ctx.device).mul_(0.02).cpu()

    saved, rc.random_tensor = rc.random_tensor, draw
    try:
        tokenizer = synthetic_tokenizer(ctx.work / "tokenizer")
        out = rc.write_random_checkpoint(ctx.work / "bf16", rc.SHAPES[ctx.plan.shape], tokenizer_dir=tokenizer)
    finally:
        rc.random_tensor = saved
    size = json.loads((out / "model.safetensors.index.json").read_text())["metadata"]["total_size"]
    return dict(shape=ctx.plan.shape, path=str(out), gb=size / 1e9)


def quantize(ctx: Ctx, save) -> dict:
    """`compress quantize bf16 --method rtn --bits 4`, through the CLI's own command, in this process."""
    from compress.cli import cli

    cli.main(["quantize", str(ctx.work / "bf16"), "--method", "rtn", "--bits", "4", "-o", str(ctx.work / "int4"), "--force"],
             standalone_mode=False)
    size = sum(f.stat().st_size for f in (ctx.work / "int4").glob("*.safetensors"))
    return dict(path=str(ctx.work / "int4"), gb=size / 1e9)


def greedy(llm, prompts: list, n: int) -> list:
    """(tokens, top-5 logprobs per token) of each prompt, greedy, run together."""
    from compress.runtime.sequence import SamplingParams

    seqs = [llm.make_sequence(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=5)) for p in prompts]
    for seq in seqs:
        llm.enqueue(seq)
    while not all(s.finished for s in seqs):
        llm.step()
    return [(s.output_token_ids, [dict(lp.top) for lp in s.logprobs]) for s in seqs]


def compare(ours: tuple, ref: tuple) -> dict:
    """Where two greedy runs first part, and whether that is a near tie: each token in the other's top 5 (vLLM's check)."""
    (a, a_top), (b, b_top) = ours, ref
    at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if at is None:
        return dict(equal=True, diverge_at=None, near_tie=None)
    return dict(equal=False, diverge_at=at, near_tie=a[at] in b_top[at] and b[at] in a_top[at])


def correctness(ctx: Ctx, save) -> dict:
    """The int4 engine's greedy tokens with the fused Triton kernels, then with every int4 matmul on reference.py's path."""
    from compress import kernels as ops
    from compress.runtime.engine import LLM

    plan, rng = ctx.plan, random.Random(0)
    llm = LLM(ctx.work / "int4", enable_prefix_caching=False, kv_cache_memory=(16 if ctx.dry_run else 512) * 2**20)
    prompts = [[rng.randrange(3, llm.vocab_size) for _ in range(rng.randint(8, 32))] for _ in range(plan.greedy_prompts)]
    fused = greedy(llm, prompts, plan.greedy_tokens)
    saved, ops.DEQUANT_GEMM_MIN_ROWS = ops.DEQUANT_GEMM_MIN_ROWS, 0  # no row count takes the fused kernel now
    try:
        reference = greedy(llm, prompts, plan.greedy_tokens)
    finally:
        ops.DEQUANT_GEMM_MIN_ROWS = saved
    results = [compare(a, b) for a, b in zip(fused, reference)]
    note = "dry run: the CPU path both times" if ctx.dry_run else "reference: compress.kernels.DEQUANT_GEMM_MIN_ROWS = 0"
    return dict(prompts=len(prompts), tokens=plan.greedy_tokens, equal=sum(r["equal"] for r in results),
                near_ties=sum(bool(r["near_tie"]) for r in results), results=results, note=note)


def engine(ctx: Ctx, save) -> dict:
    """`compress bench bf16 --compare int4 --gpu h200 --batch-sizes ...` through its function, rows kept."""
    from compress.bench.command import BenchConfig, compare_table, run_benchmark, sweep_table
    from compress.bench.sweep import SweepConfig

    plan = ctx.plan
    cfg = BenchConfig(sweep=SweepConfig(plan.engine_batches, plan.prompt_len, plan.new_tokens), gpu="h200",
                      compare=str(ctx.work / "int4"), copy_bytes=(16 if ctx.dry_run else 512) * 2**20)
    rows = run_benchmark(str(ctx.work / "bf16"), cfg)
    return dict(rows=rows, tables=sweep_table(rows, "h200") + "\n\n" + compare_table(rows))


def hf_generate(ctx: Ctx, save) -> dict:
    """transformers' generate (static batches, bf16 on the GPU) on the prompts the engine sweep used."""
    from transformers import AutoModelForCausalLM

    from compress.bench import hf_baselines
    from compress.bench.sweep import SweepConfig, batch_workload, decode_tok_s

    plan = ctx.plan
    dtype = torch.float32 if ctx.dry_run else torch.bfloat16
    hf = AutoModelForCausalLM.from_pretrained(ctx.work / "bf16", dtype=dtype, device_map=ctx.device).eval()
    generate = hf.generate  # static_batches builds its token tensors on the CPU: move them to the model
    hf.generate = lambda ids, attention_mask, **kw: generate(ids.to(hf.device), attention_mask=attention_mask.to(hf.device), **kw)
    warm = batch_workload(2, SweepConfig((2,), 16, 4, seed=1), hf.config.vocab_size)
    hf_baselines.static_batches(hf, warm.prompts, warm.params, 2, 0.0)
    rows = []
    for b in plan.hf_batches:
        w = batch_workload(b, SweepConfig(plan.engine_batches, plan.prompt_len, plan.new_tokens), hf.config.vocab_size)
        times = list(hf_baselines.static_batches(hf, w.prompts, w.params, b, 0.0).values())
        rows.append(dict(batch=b, decode_tok_s=decode_tok_s(times), dtype=str(dtype).removeprefix("torch.")))
        save(dict(rows=rows))
    return dict(rows=rows)


def llmcompressor(ctx: Ctx, save) -> dict:
    """docs/results/gpu-runs.md's comparison (compress.bench.vs_llmcompressor), when its model and packages were carried."""
    if not ctx.llmc_model:
        return dict(status="skipped", note="no --llmc-model (SmolLM2's GGUF) given")
    if importlib.util.find_spec("llmcompressor") is None:
        return dict(status="skipped", note="llmcompressor is not importable (carry its wheels, docs/gpu-check.md)")
    cmd = [sys.executable, "-m", "compress.bench.vs_llmcompressor", "--model", ctx.llmc_model, "--out", str(ctx.work / "llmc")]
    proc = subprocess.run(cmd)  # its output (times, perplexities) goes to this phase's log
    return dict(status="ok" if proc.returncode == 0 else "fail", returncode=proc.returncode)


PHASES = {f.__name__: f for f in (env, cuda_tests, kernels, moe, checkpoint, quantize, correctness, engine, hf_generate, llmcompressor)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="run one phase of compress.bench.gpu_check")
    parser.add_argument("phase", choices=sorted(PHASES))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--llmc-model", default=None)
    args = parser.parse_args(argv)
    ctx = Ctx(args.work, args.dry_run, args.llmc_model)
    for name in MISSING if args.phase not in ("env", "llmcompressor") else ():  # env reports what is installed
        sys.modules[name] = None  # now `import gguf` fails and find_spec("gguf") is None, as on the GPU machine
    out = args.work / "phases" / f"{args.phase}.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    def save(result: dict, status: str = "running") -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(status=status) | result, indent=1, default=str))
        tmp.replace(out)

    result = PHASES[args.phase](ctx, save)
    save(result, result.pop("status", "ok"))


if __name__ == "__main__":
    main()
