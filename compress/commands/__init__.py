"""One module per `compress` verb: what cli.py calls after parsing (the libraries they use are the
other packages).

    quantize       commands/quantize.py       run_quantize
    prune-distill  commands/prune_distill.py  run_prune_distill
    eval           commands/evaluate.py       run_eval
    run            commands/run.py            run_recipe
    info           commands/info.py           print_info
    generate       commands/generate.py       run_generate
    serve          runtime/server.py          serve (the server is part of the engine)
    bench          bench/command.py           run_benchmark (with the other benchmarks)
"""
