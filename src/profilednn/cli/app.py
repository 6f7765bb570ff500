"""The typer application and the one place where errors become exit codes.

Each job's verbs live in their own module in this package and register on ``app``;
they stay thin: parse arguments, call the Python API, print.
"""

from __future__ import annotations

import sys

import click
import typer
from rich.console import Console

from ..errors import ProfileDNNError

app = typer.Typer(
    name="profilednn",
    help="Profile, project and optimize deep-learning training on CPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> None:
    """Print a one-line error and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise SystemExit(code)


def run_cli(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 done, 1 bad input or failure, 2 usage)."""
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="profilednn")
    except click.exceptions.UsageError as exc:
        exc.show()
        return 2
    except click.exceptions.Abort:
        err_console.print("aborted")
        return 130
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except ProfileDNNError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 1
    except click.exceptions.ClickException as exc:
        exc.show()
        return exc.exit_code
    except BrokenPipeError:
        return 0
    if isinstance(rv, int):
        return rv
    return 0


def main() -> None:
    sys.exit(run_cli())
