"""The `compress` command: parse, call one function per verb, print. No logic here."""

import os
import signal
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time unless the user unsets it

import click  # noqa: E402

from compress.errors import UserError  # noqa: E402


@click.group()
def cli():
    """LLM compression toolkit: quantize, evaluate and inspect Llama-family models."""


@cli.command()
@click.argument("model")
@click.option("--method", type=click.Choice(["awq", "rtn"]), default="awq", show_default=True)
@click.option("--bits", type=int, default=4, show_default=True, help="4 or 3")
@click.option("--group-size", type=int, default=None, help="input columns per scale [default: 128, or 64/32 if 128 does not divide]")
@click.option("--symmetric", is_flag=True, help="symmetric quantization (no zero points)")
@click.option("--format", "fmt", type=click.Choice(["compressed-tensors", "awq"]), default="compressed-tensors", show_default=True)
@click.option("--calib-data", default=None, help=".jsonl with a 'text' field, .txt, or a local datasets dir [default: C4 under $COMPRESS_DATA_DIR]")
@click.option("--calib-samples", type=int, default=128, show_default=True)
@click.option("--calib-seq-len", type=int, default=512, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("-o", "--output", required=True, help="output directory")
@click.option("--force", is_flag=True, help="replace a non-empty output directory")
@click.option("-v", "--verbose", is_flag=True, help="print each block's search result")
def quantize(model, method, bits, group_size, symmetric, fmt, calib_data, calib_samples, calib_seq_len, seed, output, force, verbose):
    """Quantize MODEL (HF dir, .gguf, or smollm2-135m) and write a compressed checkpoint."""
    from compress.quant.config import QuantConfig
    from compress.quantize import run_quantize

    cfg = QuantConfig(method, bits, group_size, symmetric, fmt, calib_data, calib_samples, calib_seq_len, seed)
    run_quantize(model, cfg, output, force, verbose)


@cli.command("eval")
@click.argument("models", nargs=-1, required=True)
@click.option("--tasks", default="wikitext", show_default=True, help="comma-separated; available: wikitext")
@click.option("--seq-len", type=int, default=2048, show_default=True)
@click.option("--limit-tokens", type=int, default=None, help="evaluate only the first N tokens of WikiText-2")
def eval_(models, tasks, seq_len, limit_tokens):
    """Evaluate one or more MODELS; prints a table and records results in each compress.json."""
    from compress.evaluate import run_eval

    run_eval(list(models), tasks.split(","), seq_len, limit_tokens)


@cli.command()
@click.argument("model")
@click.option("--gpu", type=click.Choice(["h100", "a100", "h200", "rtx4090"]), default="h100", show_default=True)
@click.option("--batch", type=int, default=1, show_default=True)
@click.option("--context", type=int, default=2048, show_default=True)
def info(model, gpu, batch, context):
    """Parameters, sizes per format, KV-cache cost and the decode roofline of MODEL."""
    from compress.info import print_info

    print_info(model, gpu, batch, context)


def _terminate(signum, frame):
    raise KeyboardInterrupt  # so that staged outputs are removed on `kill` as on Ctrl-C


def main():
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("interrupted; no output was written", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("interrupted; no output was written", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
