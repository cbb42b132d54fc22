"""How a `compress` command runs as a process: its environment, signals, exit codes and one-line errors.

Imported before anything that reads the environment at import (huggingface_hub, tqdm): the CLI and
the benchmark scripts get the same offline default and the same quiet non-main processes.
"""

import os
import signal
import sys
import time

from compress import world

if os.environ.get("COMPRESS_ALLOW_DOWNLOAD", "").lower() not in ("1", "true", "yes", "on"):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded at run time unless the user allows it
if not world.is_main():
    os.environ["TQDM_DISABLE"] = "1"  # only the main process of a launch shows progress; tqdm reads this at import

import click  # noqa: E402

from compress.errors import UserError  # noqa: E402
from compress.malloc import return_freed_memory  # noqa: E402


def _terminate(signum, frame):
    raise KeyboardInterrupt  # so that staged outputs are removed on `kill` as on Ctrl-C


def run_command(command: click.Command) -> None:
    """Run a click command as a program: a UserError or a usage error is one line and exit 2, an interrupt exit 130."""
    signal.signal(signal.SIGTERM, _terminate)
    return_freed_memory()
    try:
        command.main(standalone_mode=False)
    except UserError as e:
        if not world.is_main():
            # every process meets the same bad input: the main one says it, the others leave after it so that the
            # launcher, which stops all processes when one exits, does not cut that line off
            time.sleep(2)
            sys.exit(2)
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except (click.exceptions.Abort, KeyboardInterrupt):
        if world.is_main():
            click.echo("interrupted; no output was written", err=True)
        sys.exit(130)
    except click.ClickException as e:
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if isinstance(e, click.UsageError) and ctx is not None else ""
        click.echo(f"error: {e.format_message()}{hint}", err=True)
        sys.exit(e.exit_code)
