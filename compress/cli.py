"""The `compress` command: parse, call one function per verb, print. No logic here."""

from compress.program import run_command  # first: it sets the environment that later imports read

import click

from compress import __version__, world
from compress.quant.config import OUTLIER_THRESHOLD, SMOOTH_ALPHA

EXAMPLES = {  # one per verb: `compress` with no arguments lists them
    "quantize": "compress quantize smollm2-135m --method awq --bits 4 -o out/awq-int4",
    "prune-distill": "compress prune-distill smollm2-135m --target-params 95M -o out/minitron-95m",
    "eval": "compress eval smollm2-135m out/awq-int4 --tasks wikitext,mmlu --limit 10",
    "run": "compress run recipes/awq-int4.yaml",
    "info": "compress info smollm2-135m --gpu h100",
    "generate": 'compress generate smollm2-135m "The capital of France is" --max-tokens 32',
    "bench": "compress bench out/awq-int4 --batch-sizes 1,8,32",
    "serve": "compress serve out/awq-int4 --port 8000",
}


@click.group(invoke_without_command=True)
@click.version_option(__version__, "--version", prog_name="compress", message="%(prog)s %(version)s")
@click.pass_context
def cli(ctx):
    """LLM compression toolkit: quantize, evaluate and inspect Llama-family models."""
    if ctx.invoked_subcommand is not None:
        world.check_launch(ctx.invoked_subcommand)
    else:
        click.echo(f"compress {__version__}: {ctx.command.help}\n\nverbs (compress VERB --help lists the options):")
        for name, command in ctx.command.commands.items():
            click.echo(f"  {name:<14} {command.get_short_help_str(limit=76)}\n  {'':<14} e.g. {EXAMPLES.get(name, '')}")


@cli.command()
@click.argument("model")
@click.option("--method", type=click.Choice(["awq", "rtn", "int8", "fp8"]), default="awq", show_default=True)
@click.option("--bits", type=int, default=4, show_default=True, help="4 or 3 (awq, rtn)")
@click.option("--group-size", type=int, default=None, help="input columns per scale [default: 128, or 64/32 if 128 does not divide]")
@click.option("--symmetric", is_flag=True, help="symmetric quantization (no zero points)")
@click.option("--format", type=click.Choice(["compressed-tensors", "awq", "gguf"]), default="compressed-tensors",
              show_default=True, help="gguf: one llama.cpp/Ollama file (-o OUT.gguf) of --gguf-type")
@click.option("--gguf-type", type=click.Choice(["Q4_K_M", "Q4_0", "Q4_1", "Q8_0", "F16", "F32"]), default=None,
              help="--format gguf: llama.cpp's file type [default: Q4_K_M; Q8_0 for --method int8]")
@click.option("--rounding", type=click.Choice(["gptq", "nearest"]), default=None,
              help="awq: codes on the searched grids by GPTQ's error feedback (act-order), or nearest (the paper's) "
                   "[default: gptq; nearest with --tune-iters]")
@click.option("--tune-iters", type=int, default=0, show_default=True,
              help="awq: then tune the rounding on each block's output for N signed-gradient steps (AutoRound's objective; "
                   "docs/awq.md); 0: off")
@click.option("--tune-dtype", type=click.Choice(["float32", "bfloat16"]), default=None,
              help="--tune-iters: the steps' matmuls [default: bfloat16 where the GPU or CPU (AVX512-BF16, AMX) has it natively]")
@click.option("--calib-data", default=None, help=".jsonl with a 'text' field, .txt, or a local datasets dir [default: C4 under $COMPRESS_DATA_DIR]")
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--calib-seq-len", type=int, default=512, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--outlier-threshold", type=float, default=OUTLIER_THRESHOLD, show_default=True,
              help="int8: input dims whose calibration max |x| reaches this stay in fp16")
@click.option("--outlier-topk", type=int, default=None, help="int8: instead, keep the K largest dims per Linear (0: no split)")
@click.option("--static-activations", is_flag=True, help="fp8: calibrated per-tensor input scales instead of dynamic per-token")
@click.option("--smooth-alpha", type=float, help=f"int8: SmoothQuant strength, 0: none [default: 0; {SMOOTH_ALPHA} per token]")
@click.option("--act-group-size", type=int, help="int8: x's steps per token and G inputs, 0: per token [default: 32 or 16]")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="dtype of the stored unquantized tensors (embeddings, norms, lm_head) and scales [default: the source's]")
@click.option("--ignore", multiple=True, help="repeatable: keep this Linear unquantized, by full name or re:REGEX (docs/cli.md)")
@click.option("-o", "--output", required=True, help="output directory (a .gguf file for --format gguf)")
@click.option("--force", is_flag=True, help="replace a non-empty output directory")
@click.option("-v", "--verbose", is_flag=True, help="print each block's search result")
def quantize(model, output, force, verbose, **options):
    """Quantize MODEL (HF dir, .gguf, or smollm2-135m) and write a compressed checkpoint."""
    from compress.quant.config import QuantConfig
    from compress.commands.quantize import run_quantize
    from compress.commands.quantize_gguf import run_quantize_gguf

    cfg = QuantConfig(**options)  # every option but the output's is one of its fields, by the same name
    (run_quantize_gguf if cfg.format == "gguf" else run_quantize)(model, cfg, output, force, verbose)


@cli.command("prune-distill")
@click.argument("model")
@click.option("--target-params", default=None, help="e.g. 95M: search a width/depth shape of about this size")
@click.option("--hidden-size", type=int, default=None)
@click.option("--intermediate-size", type=int, default=None)
@click.option("--num-heads", type=int, default=None)
@click.option("--num-kv-heads", type=int, default=None)
@click.option("--num-layers", type=int, default=None)
@click.option("--importance", type=click.Choice(["activation", "magnitude", "random"]), default="activation",
              show_default=True, help="activation (Minitron); magnitude and random are ablations")
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--calib-seq-len", type=int, default=256, show_default=True)
@click.option("--no-distill", is_flag=True, help="only prune")
@click.option("--tokens", default="300k", show_default=True, help="distillation token budget")
@click.option("--data", default=None, help="distillation text: .jsonl/.txt/datasets dir [default: C4 under $COMPRESS_DATA_DIR]")
@click.option("--seq-len", type=int, default=256, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--grad-accum", type=int, default=1, show_default=True)
@click.option("--lr", type=float, default=3e-4, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--hidden-weight", type=float, default=0.0, show_default=True, help="projected hidden-state loss weight")
@click.option("--eval-every", type=int, default=25, show_default=True, help="steps between held-out ppl checks")
@click.option("--save-every", type=int, default=25, show_default=True, help="steps between resumable checkpoints")
@click.option("--eval-rows", type=int, default=16, show_default=True, help="held-out rows of --seq-len tokens (never "
              "trained on) for the perplexity checks")
@click.option("--resume", is_flag=True, help="continue an interrupted distillation into the same -o")
@click.option("--fsdp", is_flag=True, help="across processes, shard both models and the optimizer state (FSDP) instead "
              "of a whole copy in each (DDP); an accelerate FSDP launch implies it")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", required=True, help="output directory (a plain HF checkpoint)")
@click.option("--force", is_flag=True, help="replace a non-empty output directory")
def prune_distill(model, target_params, hidden_size, intermediate_size, num_heads, num_kv_heads, num_layers, importance,
                  calib_samples, calib_seq_len, no_distill, tokens, data, seq_len, batch_size, grad_accum, lr,
                  temperature, hidden_weight, eval_every, save_every, eval_rows, resume, fsdp, seed, output, force):
    """Prune MODEL (Minitron: width and depth by activation importance) and repair it by distillation."""
    from compress.prune.config import DistillConfig, PruneConfig, parse_count
    from compress.commands.prune_distill import run_prune_distill

    pcfg = PruneConfig(parse_count(target_params), hidden_size, intermediate_size, num_heads, num_kv_heads, num_layers,
                       importance, calib_samples=calib_samples, calib_seq_len=calib_seq_len, seed=seed)
    dcfg = None if no_distill else DistillConfig(
        parse_count(tokens), seq_len, batch_size, grad_accum, lr, temperature=temperature, hidden_weight=hidden_weight,
        eval_every=eval_every, save_every=save_every, eval_rows=eval_rows, data=data, seed=seed)
    run_prune_distill(model, pcfg, dcfg, output, force, resume, fsdp)


@cli.command("eval")
@click.argument("models", nargs=-1, required=True)
@click.option("--tasks", default="wikitext", show_default=True,
              help="comma-separated: wikitext, mmlu, or lm-eval task names available offline")
@click.option("--backend", type=click.Choice(["compress", "hf"]), default="compress", show_default=True,
              help="lm-eval tasks on our engine, or on transformers (lm-eval's HFLM)")
@click.option("--num-fewshot", type=int, default=0, show_default=True, help="MMLU: 0..5 dev examples")
@click.option("--limit", type=int, default=None, help="MMLU: questions per subject (other lm-eval tasks: examples)")
@click.option("--batch-size", type=int, default=1, show_default=True, help="hf backend batch size")
@click.option("--seq-len", type=int, default=2048, show_default=True, help="wikitext window")
@click.option("--limit-tokens", type=int, default=None, help="evaluate only the first N tokens of WikiText-2")
@click.option("--report", type=click.Path(file_okay=False), default=None,
              help="write report.md, report.json and plots to this directory")
def eval_(models, tasks, backend, num_fewshot, limit, batch_size, seq_len, limit_tokens, report):
    """Evaluate one or more MODELS side by side; prints a table and records results in each compress.json."""
    from pathlib import Path

    from compress.commands.evaluate import EvalConfig, run_eval

    cfg = EvalConfig([t.strip() for t in tasks.split(",")], backend, num_fewshot, limit, seq_len, limit_tokens,
                     batch_size, None if report is None else Path(report))
    run_eval(list(models), cfg)


@cli.command()
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--model", default=None, help="the input model [default: the recipe's `model:`]")
@click.option("-o", "--output", default=None, help="run folder, one subfolder per stage [default: out/RECIPE-NAME]")
@click.option("--set", "sets", multiple=True, metavar="STAGE.KEY=VALUE", help="override a recipe key (repeatable)")
@click.option("--from", "start", default=None, metavar="STAGE", help="rerun this stage and every later one")
def run(recipe, model, output, sets, start):
    """Run RECIPE (recipes/NAME.yaml): prune-distill, quantize and eval stages, skipping those up to date."""
    from pathlib import Path

    from compress.recipe import load_recipe
    from compress.commands.run import run_recipe

    loaded = load_recipe(Path(recipe), model, sets)
    run_recipe(loaded, Path("out") / Path(recipe).stem if output is None else output, start)


@cli.command()
@click.argument("model")
@click.option("--gpu", type=click.Choice(["h100", "a100", "h200", "rtx4090"]), default="h100", show_default=True)
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--context", type=int, default=2048, show_default=True)
def info(model, gpu, batch, context):
    """Parameters, sizes per format, KV-cache cost and the decode roofline of MODEL."""
    from compress.commands.info import print_info

    print_info(model, gpu, batch, context)


DRAFT = click.option("--draft", default=None, help="speculative decoding: a smaller model with the same tokenizer proposes "
                                                  "tokens, or 'ngram' (prompt lookup, no model)")
NUM_SPECULATIVE_TOKENS = click.option("--num-speculative-tokens", type=int, default=4, show_default=True,
                                      help="draft tokens verified per step (with --draft)")
CPU_LM_HEAD = click.option("--cpu-lm-head", type=click.Choice(["auto", "stored", "int8"]), default="auto", show_default=True,
                           help="CPU: int8 holds the lm_head as int8 per row, a quarter of fp32's bytes; auto: int8 where an "
                                "untied fp32 lm_head would take over 10%% of the free memory, or a GGUF read keeping its "
                                "codes stores it quantized (docs/runtime.md)")
CPU_INT8_ACTIVATIONS = click.option("--cpu-int8-activations/--no-cpu-int8-activations", default=None,
                                    help="CPU: int4 Linears round their inputs to int8 per 32 and use integer dot products "
                                         "[default: only for a GGUF file read keeping its codes, as llama.cpp computes it]")
DRAFT_VOCAB = click.option("--draft-vocab", type=int, default=None,
                           help="the draft model scores only token ids below this (a cheaper output layer) [default: all]")


@cli.command()
@click.argument("model")
@click.argument("prompt")
@click.option("--max-tokens", type=int, default=128, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off")
@click.option("--seed", type=int, default=None, help="for reproducible sampling")
@click.option("--chat", is_flag=True, help="wrap the prompt in the tokenizer's chat template")
@click.option("--kv-cache-memory", type=int, default=None, help="bytes for the KV cache [default: a fraction of free memory]")
@DRAFT
@NUM_SPECULATIVE_TOKENS
@DRAFT_VOCAB
@CPU_LM_HEAD
@CPU_INT8_ACTIVATIONS
def generate(model, prompt, max_tokens, temperature, top_p, top_k, seed, chat, kv_cache_memory, draft, num_speculative_tokens,
             draft_vocab, cpu_lm_head, cpu_int8_activations):
    """Generate a completion of PROMPT with MODEL on the runtime, streamed to the terminal."""
    from compress.commands.generate import run_generate

    params = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    engine = dict(kv_cache_memory=kv_cache_memory, draft=draft, num_speculative_tokens=num_speculative_tokens,
                  draft_vocab=draft_vocab, cpu_lm_head=cpu_lm_head, cpu_int8_activations=cpu_int8_activations)
    run_generate(model, prompt, params, chat, engine)


@cli.command()
@click.argument("model")
@click.option("--workload", type=click.Choice(["batches", "mixed", "all"]), default="batches", show_default=True,
              help="batches: the batch-size sweep and its roofline; mixed: a seeded mixed workload vs transformers")
@click.option("--batch-sizes", default=None, help="batches: requests decoded together [default: 1,8,32; with --llamacpp 1,8]")
@click.option("--prompt-len", type=int, default=64, show_default=True, help="batches: prompt tokens of every request")
@click.option("--new-tokens", type=int, default=64, show_default=True, help="batches: tokens generated per request")
@click.option("--repeats", type=int, default=None,
              help="batches: runs of each batch size, the fastest kept [default: 1; with --llamacpp 3]")
@click.option("--gpu", default="h100", show_default=True, help="datasheet GPU for the second bound: h100, h200, a100, rtx4090")
@click.option("--compare", default=None, help="another MODEL, run in the same process; ratios are it / MODEL")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="batches: write tok/s vs batch size with the bounds (PNG)")
@click.option("--requests", type=int, default=64, show_default=True, help="mixed: number of requests")
@click.option("--max-prompt", type=int, default=512, show_default=True, help="mixed: prompt lengths are 16..max-prompt")
@click.option("--max-new", type=int, default=256, show_default=True, help="mixed: max_tokens are 16..max-new")
@click.option("--no-hf", is_flag=True, help="mixed: only our engine (no transformers baselines)")
@click.option("--kv-cache-memory", type=int, default=None, help="bytes for the KV cache [default: batches: what the largest batch needs]")
@click.option("--max-num-batched-tokens", type=int, default=512, show_default=True)
@click.option("--draft", multiple=True, help="instead: speculative decoding with this draft model (or 'ngram') vs the target alone "
                                            "(repeatable)")
@NUM_SPECULATIVE_TOKENS
@DRAFT_VOCAB
@click.option("--temperature", type=float, default=0.0, show_default=True,
              help="with --draft: 0 = greedy (outputs must equal the target's), else seeded sampling")
@click.option("--llamacpp", metavar="GGUF", default=None,
              help="instead: llama.cpp's batch-1 decode of GGUF against MODEL's, interleaved (pip install 'compress[llamacpp]')")
@CPU_LM_HEAD
@CPU_INT8_ACTIVATIONS
def bench(model, workload, batch_sizes, prompt_len, new_tokens, repeats, gpu, compare, plot, requests, max_prompt, max_new, no_hf,
          kv_cache_memory, max_num_batched_tokens, draft, num_speculative_tokens, draft_vocab, temperature, llamacpp, cpu_lm_head,
          cpu_int8_activations):
    """TTFT, inter-token latency and decode tok/s by batch size beside the memory-bandwidth roofline; a mixed workload vs transformers."""
    from pathlib import Path

    from compress.bench.command import BenchConfig, run_benchmark, sweep_config

    sweep = sweep_config(batch_sizes, prompt_len, new_tokens, repeats, llamacpp is not None)
    cfg = BenchConfig(workload, sweep, gpu, compare, Path(plot) if plot else None, not no_hf, requests, max_prompt, max_new,
                      kv_cache_memory, max_num_batched_tokens, drafts=draft, num_speculative_tokens=num_speculative_tokens,
                      draft_vocab=draft_vocab, temperature=temperature, llamacpp=Path(llamacpp) if llamacpp else None,
                      cpu_lm_head=cpu_lm_head, cpu_int8_activations=cpu_int8_activations)
    run_benchmark(model, cfg)


@cli.command()
@click.argument("model")
@click.option("--host", default="127.0.0.1", show_default=True, help="0.0.0.0 exposes the server to the network")
@click.option("--port", type=int, default=8000, show_default=True)
@click.option("--served-model-name", default=None, help="the name clients send as `model` [default: MODEL]")
@click.option("--api-key", envvar="COMPRESS_API_KEY", default=None,
              help="require 'Authorization: Bearer KEY' on /v1 routes [env: COMPRESS_API_KEY]")
@click.option("--max-num-seqs", type=int, default=64, show_default=True, help="requests decoded at once")
@click.option("--max-waiting", type=int, default=256, show_default=True, help="queued requests beyond which new ones get 429")
@click.option("--max-model-len", type=int, default=None, help="context limit [default: the model's]")
@click.option("--kv-cache-memory", type=int, default=None, help="bytes for the KV cache [default: 10%% of free memory]")
@click.option("--max-body-bytes", type=int, default=4 << 20, show_default=True, help="larger request bodies get 413")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto", show_default=True,
              help="auto: the checkpoint's dtype on CUDA, float32 on CPU (the CPU kernels are fp32)")
@DRAFT
@NUM_SPECULATIVE_TOKENS
@DRAFT_VOCAB
@CPU_LM_HEAD
@CPU_INT8_ACTIVATIONS
def serve(model, host, port, served_model_name, api_key, max_num_seqs, max_waiting, max_model_len, kv_cache_memory,
          max_body_bytes, dtype, draft, num_speculative_tokens, draft_vocab, cpu_lm_head, cpu_int8_activations):
    """Serve MODEL with an OpenAI-compatible API (/v1/completions, /v1/chat/completions, /metrics)."""
    from compress.runtime.server import serve as run_server

    run_server(model, host, port, served_model_name, api_key, max_waiting, max_body_bytes, max_num_seqs=max_num_seqs,
               max_model_len=max_model_len, kv_cache_memory=kv_cache_memory, dtype=dtype, draft=draft,
               num_speculative_tokens=num_speculative_tokens, draft_vocab=draft_vocab, cpu_lm_head=cpu_lm_head,
               cpu_int8_activations=cpu_int8_activations)


def main():
    run_command(cli)


if __name__ == "__main__":
    main()
