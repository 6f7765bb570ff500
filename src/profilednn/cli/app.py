"""The typer application and the one place where errors become exit codes.

Each job's verbs live in their own module in this package and register on ``app``;
they stay thin: parse arguments, call the Python API, print.
"""

from __future__ import annotations

import copy
import inspect
import sys
from typing import NoReturn

import typer
from rich.console import Console

from ..errors import ProfileDNNError
from ..extras import missing_extra_for
from ..formatting import styled

app = typer.Typer(
    name="profilednn",
    help="Profile, project and optimize deep-learning training on CPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Markup is off: paths, arguments, module and op names are user text and must print as
# they are ("[/red]" in a file name is not a style). Style with ``styled`` / rich Text.
console = Console(markup=False)
err_console = Console(stderr=True, markup=False)


def print_error(message: object) -> None:
    """One line on stderr: ``error: MESSAGE``."""
    err_console.print(styled("error:", "bold red", f" {message}"), highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> None:
    """Print a one-line error and exit with ``code``."""
    print_error(message)
    raise SystemExit(code)


def report_interrupt(exc: BaseException) -> int:
    """Say that a job was interrupted (naming the Run it kept, if any); the exit code to use."""
    from ..interrupts import interrupt_exit_code

    run = getattr(exc, "run", None)
    kept = f": the Run was kept with status `{run.status}`: {run.path}" if run is not None else ""
    err_console.print(f"interrupted ({exc or 'Ctrl-C'}){kept}", highlight=False, soft_wrap=True)
    return interrupt_exit_code(exc)


def exit_interrupted(exc: BaseException) -> NoReturn:
    """Inside a verb (where click would turn Ctrl-C into "Aborted!"): report and exit."""
    raise SystemExit(report_interrupt(exc))


_KEEP_LINES = ("-", "*", "$", "\b", "|", ">")


def reflowed(doc: str) -> str:
    """``doc`` with the line breaks inside each prose paragraph joined, so that rich wraps it
    to the terminal (typer keeps them: at 80 columns a sentence broke after every source
    line). Paragraphs of lists or examples (a line indented or starting with -, *, $, |, >
    or click's no-rewrap mark) keep theirs."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(
        p if any(line[:1].isspace() or line.lstrip().startswith(_KEEP_LINES) for line in p.splitlines())
        else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs)


def _reflow_help(commands: list) -> None:
    """Give each command without an explicit ``help`` its reflowed docstring."""
    for c in commands:
        if c.help is None and c.callback is not None and c.callback.__doc__:
            c.help = reflowed(c.callback.__doc__)


def app_for(argv: list[str]) -> typer.Typer:
    """``app`` with only the verb ``argv`` names (all of ``app`` when it names none).

    Typer builds every registered command on each run (signatures, type hints), which
    is a good part of a short verb's start-up; usage, help and errors of that verb are
    the same either way (the root callback keeps it a group).
    """
    _reflow_help(app.registered_commands)
    name = argv[0] if argv else ""
    hits = [c for c in app.registered_commands
            if (c.name or getattr(c.callback, "__name__", "").lower().replace("_", "-")) == name]
    if len(hits) != 1 or app.registered_groups:
        return app
    only = copy.copy(app)
    only.registered_commands = hits
    return only


def run_cli(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 done, 1 bad input or failure, 2 usage).

    Typer handles usage errors itself (exit 2); ProfileDNN's own errors become one
    line on stderr and exit 1.
    """
    from ..interrupts import signals_as_interrupts

    try:
        with signals_as_interrupts():  # SIGTERM/SIGHUP end a job like Ctrl-C: Runs are kept
            app_for(sys.argv[1:] if argv is None else argv)(args=argv, prog_name="profilednn")
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        err_console.print(str(code), highlight=False)
        return 1
    except ProfileDNNError as exc:
        print_error(exc)
        return 1
    except ModuleNotFoundError as exc:
        # An optional package (the [zoo] extra) imported at module level: say which extra.
        message = missing_extra_for(exc)
        if message is None:
            raise
        print_error(message)
        return 1
    except KeyboardInterrupt as exc:
        return report_interrupt(exc)
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a file or folder the system refused: one line, not a traceback
        where = f": {exc.filename}" if exc.filename else ""
        print_error(f"{exc.strerror or exc}{where}")
        return 1
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
