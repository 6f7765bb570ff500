"""Per-rank wrapper: pin this rank to its cores, set its variables, point its output at its
log files, run the command, and end a Python rank once its script has finished.

torchrun (or mpirun) starts this file once per rank; it reads the launch plan written
by ``profilednn launch``, applies the rank's CPU affinity with ``os.sched_setaffinity``
(inherited across exec) and its variables (OpenMP/MKL threads, allocator preload, ...),
and redirects its stdout/stderr to ``<log_dir>/rank<R>[.attempt<N>].{stdout,stderr}.log``
when the plan names a log directory (the launcher relays whole lines from there). The rank
keeps this process id throughout, so torchrun's signals reach it.

A Python command (``python [options] script.py|-m module|-c code ARGS``, or a script whose
``#!`` line names a Python interpreter, as console scripts have) is run by this file in
the rank's own interpreter: here when nothing has to change at exec (no ``numactl``
prefix, no new ``LD_PRELOAD``, no interpreter options), else after one exec of
``[prefix] python [options] rank_entry.py --run ...``. When the script has returned or
called ``sys.exit`` (or raised: its traceback is printed as Python prints it), the rank
ends as Python would, minus native teardown: non-daemon threads are joined, ``atexit``
handlers run, open files and stdout/stderr (Python's and C's) are flushed, and
``os._exit`` ends the process with the script's own exit code, as ``multiprocessing`` ends
its children. C++ static destructors therefore never run, and a native thread still
joinable at that point (Gloo's, PyTorch's: pytorch/pytorch#190489) cannot abort a rank
that finished its work ("terminate called without an active exception"). The rank
writes how it ended to ``<plan dir>/exits/`` for the launcher's summary. Any other
command is exec'd as it is (no such exit).

It is run as a script (not ``-m``) and imports only the standard library, so starting a
rank costs no extra package import.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from typing import NoReturn

PLAN_ENV = "PROFILEDNN_PLAN_FILE"
LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
PYTHON_NAMES = ("python", "python3")
RUN_FLAG = "--run"  # second stage: rank_entry.py --run STATUS_FILE KIND TARGET ARGS...
EXITS_DIR = "exits"  # under the plan directory: one JSON per rank that ended through finish()
ENTRY_FILE = os.path.abspath(__file__)
# Variables the dynamic loader or the allocator read at process start: a change needs an exec.
START_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH", "MALLOC_CONF")
NO_ARG_FLAGS = "bBdEIOPqsSuv"  # interpreter flags kept as they are (-i, -x, -h, -V, ...: left to Python)
ARG_OPTIONS = ("W", "X")  # interpreter options that take a value
NOT_SOURCE = (".pyc", ".pyo", ".pyz", ".zip")  # targets Python runs through its zipimport/pyc loaders


# --------------------------------------------------------------------------- the rank's setup
def local_rank(env: dict[str, str]) -> int:
    """This rank's index on its node, from torchrun's or the MPI launcher's variables."""
    for name in LOCAL_RANK_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    raise SystemExit(f"profilednn rank_entry: none of {', '.join(LOCAL_RANK_VARS)} is set; "
                     "start ranks with `profilednn launch`")


def global_rank(env: dict[str, str], default: int) -> int:
    """This rank's index in the job (torchrun's RANK or the MPI launcher's); ``default`` if unset."""
    for name in RANK_VARS:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return default


def attempt_of(env: dict[str, str]) -> int:
    """torchrun's restart count of this attempt (0 for the first)."""
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return int(attempt) if attempt.isdigit() else 0


def rank_file_name(rank: int, attempt: int, suffix: str) -> str:
    """``rank<R>[.attempt<N>]<suffix>``: the name of a rank's log or exit file."""
    middle = f".attempt{attempt}" if attempt else ""
    return f"rank{rank}{middle}{suffix}"


def redirect_output(log_dir: str, rank: int, attempt: int) -> None:
    """Point fd 1 and 2 at this rank's log files (appended; the launcher relays them)."""
    for fd, stream in ((1, "stdout"), (2, "stderr")):
        path = os.path.join(log_dir, rank_file_name(rank, attempt, f".{stream}.log"))
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(target, fd)
        os.close(target)


def exit_file(plan_file: str, rank: int, attempt: int) -> str:
    """Where this rank writes how it ended: ``<plan dir>/exits/rank<R>[.attempt<N>].json``."""
    return os.path.join(os.path.dirname(plan_file), EXITS_DIR, rank_file_name(rank, attempt, ".json"))


def resolve_command(argv: list[str]) -> list[str]:
    """The user's command with a bare ``python``/``python3`` replaced by this interpreter."""
    if not argv:
        raise SystemExit("profilednn rank_entry: no command to run")
    if argv[0] in PYTHON_NAMES:
        return [sys.executable, *argv[1:]]
    return list(argv)


def apply(plan: dict, rank: int, env: dict[str, str]) -> list[int]:
    """Set ``env`` for rank ``rank`` of ``plan`` and pin this process; returns the CPUs."""
    slots = plan["ranks"]
    if not 0 <= rank < len(slots):
        raise SystemExit(f"profilednn rank_entry: local rank {rank} is outside the plan "
                         f"({len(slots)} ranks per node)")
    slot = slots[rank]
    cpus = [int(c) for c in slot["cpus"]]
    env.update(plan["env"][rank])
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    return cpus


# --------------------------------------------------------------------------- the Python command
class PythonCall:
    """A Python command this file can run itself: ``interpreter [options]`` and what it runs
    (``kind`` ``path``, ``module`` or ``code``; ``target`` the file, module name or source)."""

    __slots__ = ("interpreter", "options", "kind", "target", "args")

    def __init__(self, interpreter: str, options: list[str], kind: str, target: str, args: list[str]) -> None:
        self.interpreter, self.options, self.kind, self.target, self.args = interpreter, options, kind, target, args

    def stage_two(self, status_file: str) -> list[str]:
        """The command line that runs it through this file in ``interpreter``."""
        return [self.interpreter, *self.options, ENTRY_FILE, RUN_FLAG, status_file, self.kind, self.target,
                *self.args]


def is_python(program: str) -> bool:
    """``python``, ``python3``, ``python3.11`` (a path to one too), the names a Python 3 takes."""
    name = os.path.basename(program)
    version = name[len("python"):]
    if not name.startswith("python") or version.startswith("2"):
        return False
    return version == "" or all(part.isdigit() for part in version.split("."))


def find_program(program: str, path: str | None) -> str | None:
    """The file ``execvp`` would run for ``program`` (searched in ``path`` when it has no slash)."""
    found = program if os.sep in program else shutil.which(program, path=path)
    return found if found and os.path.isfile(found) else None


def shebang_python(found: str) -> str | None:
    """The interpreter of the file ``found`` when its ``#!`` line names an absolute Python 3
    path and nothing else (console scripts such as ``profilednn``), else None."""
    try:
        with open(found, "rb") as fh:
            first = fh.readline(512)
    except OSError:
        return None
    interpreter = first[2:].strip().decode("utf-8", "replace")
    if not first.startswith(b"#!") or " " in interpreter or not os.path.isabs(interpreter):
        return None
    return interpreter if is_python(interpreter) and os.access(interpreter, os.X_OK) else None


def parse_python_args(argv: list[str]) -> tuple[list[str], str, str, list[str]] | None:
    """``(options, kind, target, args)`` of ``python ARGV``; None for a form left to Python
    itself (stdin, no target, ``-i``, ``-x``, ``--help``, a zip or .pyc target, ...)."""
    options: list[str] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        arg = argv[i]
        if arg == "--check-hash-based-pycs" and i + 1 < len(argv):
            options += argv[i:i + 2]
            i += 2
            continue
        if arg.startswith("--"):
            return None
        for j, flag in enumerate(arg[1:], start=1):
            if flag in NO_ARG_FLAGS:
                options.append(f"-{flag}")
                continue
            if flag not in ARG_OPTIONS and flag not in ("c", "m"):
                return None
            value, i = _option_value(argv, i, arg[j + 1:])
            if value is None:
                return None
            if flag in ("c", "m"):
                return options, "code" if flag == "c" else "module", value, argv[i:]
            options += [f"-{flag}", value]
            break
        else:
            i += 1
    if i >= len(argv) or argv[i] == "-":
        return None
    target = argv[i]
    if not os.path.isfile(target) or target.endswith(NOT_SOURCE):
        return None
    return options, "path", target, argv[i + 1:]


def _option_value(argv: list[str], i: int, attached: str) -> tuple[str | None, int]:
    """The value of the option in ``argv[i]`` (``-Wignore`` or ``-W ignore``) and the index
    after it; None when the command line ends first."""
    if attached:
        return attached, i + 1
    return (argv[i + 1], i + 2) if i + 1 < len(argv) else (None, i + 1)


def python_call(command: list[str], env: dict[str, str]) -> PythonCall | None:
    """``command`` as a Python call this file can run, or None to exec it as it is."""
    if is_python(command[0]) or command[0] == sys.executable:
        parsed = parse_python_args(command[1:])
        return PythonCall(command[0], *parsed) if parsed else None
    found = find_program(command[0], env.get("PATH"))
    interpreter = shebang_python(found) if found else None
    if found is None or interpreter is None:
        return None
    return PythonCall(interpreter, [], "path", found, command[1:])


def runs_here(call: PythonCall, prefix: list[str], env: dict[str, str]) -> bool:
    """Whether this interpreter can run ``call`` itself, or one exec must come first (a
    prefix such as numactl, another interpreter or options, variables read at start)."""
    same_start = all(env.get(name) == os.environ.get(name) for name in START_VARS)
    return not prefix and not call.options and call.interpreter == sys.executable and same_start


# --------------------------------------------------------------------------- running the script
def _main_module(attrs: dict) -> dict:
    """A fresh ``__main__`` module, left in ``sys.modules`` (pickle finds the script's classes
    there, also in its atexit handlers); returns its namespace."""
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(attrs)
    sys.modules["__main__"] = main
    return main.__dict__


def set_path0(call: PythonCall) -> None:
    """``sys.path[0]`` as ``python`` sets it (the script's directory, ``-m``'s working
    directory, ``-c``'s ''; none under ``-P``/``-I``) instead of this file's directory,
    whose modules (profilednn's ``distributed/``) must not shadow the script's imports."""
    entry_dir = os.path.dirname(os.path.realpath(ENTRY_FILE))
    if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == entry_dir:
        del sys.path[0]
    if getattr(sys.flags, "safe_path", False) or sys.flags.isolated:
        return
    if call.kind == "path":
        sys.path.insert(0, os.path.dirname(os.path.realpath(call.target)))
    else:
        sys.path.insert(0, os.getcwd() if call.kind == "module" else "")


def load(call: PythonCall) -> tuple[object, dict, str]:
    """``(code object, __main__ attributes, argv[0])`` as ``python`` would set them."""
    import builtins

    if call.kind == "code":
        return compile(call.target, "<string>", "exec"), {"__builtins__": builtins}, "-c"
    if call.kind == "module":
        return _module_code(call.target)
    path = os.path.abspath(call.target)
    with io.open_code(path) as fh:  # as python opens a script; compile() honours its coding line
        code = compile(fh.read(), path, "exec")
    return code, {"__builtins__": builtins, "__file__": path, "__cached__": None}, call.target


def _module_code(name: str) -> tuple[object, dict, str]:
    """What ``python -m name`` runs (a package runs its ``__main__``)."""
    import builtins
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    code = spec.loader.get_code(spec.name) if spec is not None and spec.loader is not None else None
    if code is None:
        raise SystemExit(f"{sys.executable}: No module named {name}")
    attrs = {"__builtins__": builtins, "__file__": spec.origin, "__cached__": spec.cached, "__spec__": spec,
             "__loader__": spec.loader, "__package__": spec.parent}
    return code, attrs, spec.origin or name


def run_script(call: PythonCall, status_file: str) -> NoReturn:
    """Run ``call`` as the program's ``__main__``, then :func:`finish` with its exit code."""
    pid = os.getpid()
    try:
        set_path0(call)
        code, attrs, argv0 = load(call)
        sys.argv = [argv0, *call.args]
        exec(code, _main_module(attrs))
    except SystemExit as exc:
        exit_code, how = system_exit_code(exc), "sys.exit"
    except KeyboardInterrupt as exc:
        print_uncaught(exc)
        exit_code, how = 128 + 2, "interrupted"
    except BaseException as exc:  # noqa: BLE001 - any uncaught error fails the rank, as in Python
        print_uncaught(exc)
        exit_code, how = 1, "raised"
    else:
        exit_code, how = 0, "returned"
    finish(exit_code, how, status_file if os.getpid() == pid else "")  # a forked child reports nothing


def system_exit_code(exc: SystemExit) -> int:
    """What Python does with an uncaught ``SystemExit``: None is 0, an int is itself, anything
    else is printed on stderr and is 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def print_uncaught(exc: BaseException) -> None:
    """The traceback Python prints for an uncaught exception (through ``sys.excepthook``),
    without this file's frames."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == ENTRY_FILE:
        tb = tb.tb_next
    exc = exc.with_traceback(tb)
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException as hook_error:  # noqa: BLE001 - Python's own fallback
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(exc), exc, tb)


# --------------------------------------------------------------------------- the clean exit
def finish(exit_code: int, how: str, status_file: str) -> NoReturn:
    """End this process as Python's own shutdown would, minus native teardown: join the
    non-daemon threads, run the atexit handlers, flush open files and the std streams
    (Python's and C's), record how the rank ended, then ``os._exit(exit_code)``."""
    wait_for_threads()
    run_atexit()
    flush_open_files()
    if not flush_std_streams():
        exit_code = 120  # what Python exits with when it cannot flush stdout
    flush_c_stdio()
    if status_file:
        write_exit(status_file, exit_code & 0xFF, how)
    if how == "interrupted":
        die_by_sigint()
    os._exit(exit_code & 0xFF)


def wait_for_threads() -> None:
    """Join the non-daemon threads, as interpreter shutdown does first (``threading._shutdown``
    also runs ``concurrent.futures``' exit hooks, so executors' workers end)."""
    threading = sys.modules.get("threading")
    if threading is None:
        return
    try:
        threading._shutdown()  # noqa: SLF001 - what Py_FinalizeEx and multiprocessing call
    except KeyboardInterrupt:
        pass  # Ctrl-C while waiting: Python's shutdown, too, stops waiting and goes on


def run_atexit() -> None:
    """The interpreter's exit handlers: the script's loggers, trackers, checkpoint writers."""
    import atexit

    atexit._run_exitfuncs()  # noqa: SLF001 - errors are printed as at a normal exit


def flush_open_files() -> None:
    """Flush every open, writable Python file: a normal exit flushes them as the modules
    holding them are torn down, which ``os._exit`` skips."""
    import gc

    texts, buffers = [], []
    for obj in gc.get_objects():  # type(), not isinstance(): no object's __class__ property runs
        if issubclass(type(obj), io.TextIOWrapper):
            texts.append(obj)
        elif issubclass(type(obj), (io.BufferedWriter, io.BufferedRandom)):
            buffers.append(obj)
    for stream in texts + buffers:  # text first: its flush fills the buffer below it
        try:
            if not stream.closed and stream.writable():
                stream.flush()
        except (OSError, ValueError):
            pass  # closed underneath or unwritable: a normal exit would lose it too


def flush_std_streams() -> bool:
    """Flush ``sys.stdout`` and ``sys.stderr``; False when stdout could not be flushed."""
    ok = True
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError, AttributeError):  # AttributeError: a stream object with no flush
            ok = ok and stream is not sys.stdout
    return ok


def flush_c_stdio() -> None:
    """``fflush(NULL)``: what native code printed with C stdio (oneDNN's verbose lines, a C
    extension's printf) and still buffers, as ``exit()`` would write it."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass  # no C library to ask: nothing native was buffered through it


def native_threads() -> list[str]:
    """Names of the threads of this process that Python does not know: native ones (Gloo's
    loops, OpenMP workers, ...) still running at the rank's end, which a native teardown
    would have had to stop."""
    threading = sys.modules.get("threading")
    known = {os.getpid()}
    if threading is not None:
        known |= {threading.get_native_id()} | {t.native_id for t in threading.enumerate() if t.is_alive()}
    names = []
    try:
        for tid in os.listdir("/proc/self/task"):
            if int(tid) not in known:
                with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as fh:
                    names.append(fh.read().strip())
    except OSError:
        pass  # no /proc (or a thread ended meanwhile): what was read so far
    return sorted(names)


def write_exit(status_file: str, status: int, how: str) -> None:
    """Record how the rank ended (atomically) for the launcher's summary; best effort."""
    record = {"rank": global_rank(dict(os.environ), -1), "attempt": attempt_of(dict(os.environ)),
              "pid": os.getpid(), "exit_code": status, "ended": how, "native_threads": native_threads()}
    tmp = f"{status_file}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(status_file), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh)
        os.replace(tmp, status_file)
    except OSError:
        pass  # the launcher has gone (its plan directory with it): nobody to tell


def die_by_sigint() -> None:
    """End by SIGINT, as Python does after an uncaught KeyboardInterrupt, so the parent sees it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


# --------------------------------------------------------------------------- entry points
def run_stage_two(args: list[str]) -> NoReturn:
    """``--run STATUS_FILE KIND TARGET ARGS...``: the exec'd second stage runs the script."""
    if len(args) < 4 or args[2] not in ("path", "module", "code"):
        raise SystemExit("profilednn rank_entry: --run needs STATUS_FILE KIND TARGET [ARGS...]")
    run_script(PythonCall(sys.executable, [], args[2], args[3], args[4:]), args[1])


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [RUN_FLAG]:
        run_stage_two(args)
    if args and args[0] == "--":
        args = args[1:]
    plan_file = os.environ.get(PLAN_ENV)
    if not plan_file:
        raise SystemExit(f"profilednn rank_entry: {PLAN_ENV} is not set; start ranks with `profilednn launch`")
    with open(plan_file, encoding="utf-8") as fh:
        plan = json.load(fh)
    env = dict(os.environ)
    rank = local_rank(env)
    apply(plan, rank, env)
    command = resolve_command(args)
    prefix = list((plan.get("prefix") or [[]] * (rank + 1))[rank])
    attempt, grank = attempt_of(env), global_rank(env, rank)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.get("log_dir"):
        try:
            redirect_output(plan["log_dir"], grank, attempt)
        except OSError as exc:
            raise SystemExit(f"profilednn rank_entry: cannot write the rank's log in {plan['log_dir']}: "
                             f"{exc.strerror or exc}") from exc
    call = python_call(command, env)
    status_file = exit_file(plan_file, grank, attempt)
    if call is not None and runs_here(call, prefix, env):
        os.environ.update(env)
        run_script(call, status_file)
    command = [*prefix, *(call.stage_two(status_file) if call is not None else command)]
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        raise SystemExit(f"profilednn rank_entry: cannot run {command[0]!r}: {exc.strerror or exc}") from exc


if __name__ == "__main__":
    main()
