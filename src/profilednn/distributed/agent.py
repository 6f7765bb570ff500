"""torchrun, with a machine-readable account of how the job ended.

``python -m profilednn.distributed.agent --report FILE -- TORCHRUN_ARGS...`` parses the
arguments with torchrun's own parser and runs torchrun's own ``run`` (the elastic
agent: rendezvous, worker start, monitoring, teardown and restarts are torch's). When
the job fails it writes FILE as JSON: each failed rank with its exit code or signal, or
the agent's own error (a rendezvous timeout, say), so ``profilednn launch`` can name the
rank instead of pointing at a wall of log text.
"""

from __future__ import annotations

import signal
import sys
import traceback
from pathlib import Path

from ..run import atomic_write_json


def _signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--report":
        print("usage: python -m profilednn.distributed.agent --report FILE -- TORCHRUN_ARGS", file=sys.stderr)
        return 2
    report, rest = args[1], args[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    parsed = get_args_parser().parse_args(rest)
    try:
        run(parsed)
    except ChildFailedError as exc:
        failures = []
        first = exc.get_first_failure()[0]
        for rank, failure in sorted(exc.failures.items(), key=lambda kv: (kv[1].timestamp, kv[0])):
            failures.append({
                "rank": int(rank),
                "local_rank": int(failure.local_rank),
                "pid": int(failure.pid),
                "exitcode": int(failure.exitcode),
                "signal": _signal_name(int(failure.exitcode)),
                "error_file": failure.error_file,
                "timestamp": int(failure.timestamp),
                "first": int(rank) == int(first),
            })
        atomic_write_json(Path(report), {"status": "failed", "kind": "rank", "failures": failures})
        return 1
    except BaseException as exc:  # rendezvous timeouts, signals to the agent, ...
        atomic_write_json(Path(report), {"status": "failed", "kind": "agent",
                        "error": f"{type(exc).__name__}: {exc}",
                        "traceback": "".join(traceback.format_exception(exc))})
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    atomic_write_json(Path(report), {"status": "complete"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
