"""Code that measures, apart from the code it measures (DESIGN.md "Where benchmarks live").

The engine (compress/runtime/), the kernels and the compression code never import from here;
this package imports them, one way. Figures it produces go to docs/results/ with the command
that made them.

`compress bench` (the verb):
    command.py        BenchConfig and run_benchmark: dispatch, the roofline rows and tables
    sweep.py          --workload batches: B identical requests at once, per batch size
    mixed.py          --workload mixed: one seeded workload, our engine vs transformers
    hf_baselines.py   transformers' generate (static batches) and continuous batching
    speculative.py    --draft: speculative decoding against the target alone
    footprint.py      the bytes a decode step reads (weights as held and as stored, KV per token)
    bandwidth.py      this machine's memory bandwidth (a copy test): the roof "here"
    plot.py           --plot: tok/s vs batch size with the bounds
    workload.py, peak_rss.py   requests and their token times; the process's peak RSS

Scripts (python -m compress.bench.NAME; each docstring gives the command):
    loadtest          many streaming clients against `compress serve`, exactness checked
    cpu_kernels       the C kernels vs the torch paths they replace (CPU)
    triton_kernels    the Triton kernels vs bf16/fp16 torch (GPU; --dry-run on CPU)
    quant_quality     fp32 vs RTN vs AWQ at int4/int3 on the built-in and off-grid models: time, size, perplexity
    vs_llmcompressor  llm-compressor's AWQ beside ours on the same calibration tokens
    int8_report       int8 outlier dims per layer type, int8/fp8 perplexity ablations
    fp8_report        where fp8's perplexity loss comes from: weights, activations, each Linear kind's inputs
    eval_backends     our lm-eval backend vs lm-eval's HFLM on MMLU: accuracy and wall time
    server_mmlu       lm-eval's local-completions against `compress serve` vs in process
    scale_bench, random_checkpoint, first_blocks   real-size (7-70B shapes) memory and time
    gpu_check, gpu_phases                          every GPU figure in one prepared run

Not here, because more than `compress bench` needs them: compress/roofline.py (the sizes and
bounds of `compress info`, and the KV bytes per token the engine sizes its pool with) and
compress/runtime/local_server.py (the server on a loopback port, for the runtime's tests too).
"""
