"""The typer application and the one place where errors become exit codes.

Each job's verbs live in their own module in this package and register on ``app``;
they stay thin: parse arguments, call the Python API, print.
"""

from __future__ import annotations

import sys

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
    """Run the CLI; returns the exit code (0 done, 1 bad input or failure, 2 usage).

    Typer handles usage errors itself (exit 2); ProfileDNN's own errors become one
    line on stderr and exit 1.
    """
    try:
        app(args=argv, prog_name="profilednn")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err_console.print(str(code), highlight=False)
        return 1
    except ProfileDNNError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 1
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    return 0


def main() -> None:
    sys.exit(run_cli())


@app.command("version")
def version_cmd() -> None:
    """Print ProfileDNN's version."""
    from .. import __version__

    console.print(f"profilednn {__version__}")


@app.callback()
def _root() -> None:
    """Profile, project and optimize deep-learning training on CPUs."""
