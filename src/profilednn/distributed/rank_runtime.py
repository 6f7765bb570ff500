"""What each rank runs under besides its cores: NUMA memory binding, allocator, OpenMP variables.

Parity with ``torch.backends.xeon.run_cpu`` where it matters for training:

- memory bound to the rank's NUMA node(s) with ``numactl --membind`` when numactl is
  installed and allowed (the check runs it once); without it a note says memory follows
  Linux's first-touch placement;
- tcmalloc or jemalloc preloaded (``LD_PRELOAD``) when installed, tcmalloc first as
  run_cpu does, with run_cpu's ``MALLOC_CONF`` for jemalloc;
- ``KMP_AFFINITY``/``KMP_BLOCKTIME`` only when Intel's OpenMP (libiomp5) is the runtime the
  ranks load; stock PyTorch wheels load GNU libgomp, which ignores them.

A variable the user already set is never overridden (it is kept and shown as theirs);
only the thread count follows ``--threads-per-rank``. Detection (:func:`probe_runtime`)
is separate from the decision (:func:`rank_runtime`) so tests inject machines.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError
from .plan import LaunchPlan, rank_env

ALLOCATORS = ("auto", "tcmalloc", "jemalloc", "system")
# The MALLOC_CONF torch.backends.xeon.run_cpu sets with jemalloc.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto"
OPENMP_RUNTIMES = ("intel", "gnu", "llvm", "unknown")
THREAD_COUNT_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # follow --threads-per-rank
USER_KEPT_VARS = ("OMP_PLACES", "OMP_PROC_BIND")  # the plan's unless the user set them


@dataclass(frozen=True)
class RuntimeProbe:
    """What this machine offers the ranks: numactl, allocator libraries, the OpenMP runtime."""

    numactl: str | None = None  # path of a numactl that may bind memory here
    numactl_detail: str = ""  # why numactl is absent or unusable
    libraries: dict[str, str] = field(default_factory=dict)  # "tcmalloc"/"jemalloc" -> .so path
    openmp: str = "unknown"  # one of OPENMP_RUNTIMES


@dataclass(frozen=True)
class RankRuntime:
    """The decided per-rank environment and command prefix, with lines that explain them."""

    env: tuple[dict[str, str], ...]  # per local rank: variables rank_entry sets before exec
    prefix: tuple[tuple[str, ...], ...]  # per local rank: e.g. ("/usr/bin/numactl", "--membind=0")
    settings: tuple[str, ...]  # one line per decision, for the plan and --dry-run
    notes: tuple[str, ...] = ()

    def memory(self, local_rank: int) -> str:
        """How the rank's memory is placed, for the plan table."""
        prefix = self.prefix[local_rank]
        if prefix:
            return "numactl " + " ".join(prefix[1:-1])
        return "first touch"


# --------------------------------------------------------------------------- detection
def _library_dirs(env: dict[str, str]) -> list[str]:
    dirs = [f"{env[k]}/lib" for k in ("CONDA_PREFIX", "VIRTUAL_ENV") if env.get(k)]
    dirs += [str(Path.home() / ".local/lib"), "/usr/local/lib", "/usr/local/lib64", "/usr/lib",
             "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib/x86_64-linux-gnu"]
    return dirs


def find_library(name: str, env: dict[str, str]) -> str | None:
    """``lib<name>.so`` (or a versioned ``lib<name>.so.N``) in run_cpu's places and Debian's."""
    for d in _library_dirs(env):
        for pattern in (f"lib{name}.so", f"lib{name}.so.[0-9]*"):
            hits = sorted(glob.glob(os.path.join(d, pattern)))
            if hits:
                return hits[0]
    return None


def _torch_lib_names() -> list[str]:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return []
    root = Path(spec.origin).parent
    names: list[str] = []
    for d in (root / "lib", root.parent / "torch.libs"):
        if d.is_dir():
            names += [p.name for p in d.iterdir()]
    return names


def detect_openmp(env: dict[str, str], torch_libs: list[str] | None = None) -> str:
    """The OpenMP runtime the ranks will load: a preloaded one wins, else the one torch ships."""
    preload = env.get("LD_PRELOAD", "")
    for name, runtime in (("libiomp5", "intel"), ("libgomp", "gnu"), ("libomp", "llvm")):
        if name in preload:
            return runtime
    libs = _torch_lib_names() if torch_libs is None else torch_libs
    for prefix, runtime in (("libiomp5", "intel"), ("libgomp", "gnu"), ("libomp", "llvm")):
        if any(n.startswith(prefix) for n in libs):
            return runtime
    return "unknown"


def _usable_numactl(env: dict[str, str]) -> tuple[str | None, str]:
    path = shutil.which("numactl", path=env.get("PATH"))
    if path is None:
        return None, "numactl is not installed"
    try:
        res = subprocess.run([path, "--membind=0", "true"], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run ({exc})"
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
        return None, f"{path} may not bind memory here ({why})"
    return path, ""


def probe_runtime(env: dict[str, str] | None = None, *, numa_nodes: int = 1) -> RuntimeProbe:
    """Look at this machine (numactl is only tried when there is more than one NUMA node)."""
    env = dict(os.environ) if env is None else env
    numactl, detail = _usable_numactl(env) if numa_nodes > 1 else (None, "")
    libs = {n: p for n in ("tcmalloc", "jemalloc") if (p := find_library(n, env))}
    return RuntimeProbe(numactl=numactl, numactl_detail=detail, libraries=libs, openmp=detect_openmp(env))


# --------------------------------------------------------------------------- decision
def _allocator(probe: RuntimeProbe, requested: str, env: dict[str, str]) -> tuple[str | None, list[str], list[str]]:
    """(library to preload or None, setting lines, notes)."""
    if requested not in ALLOCATORS:
        raise InputError(f"--allocator must be one of {', '.join(ALLOCATORS)}, not {requested!r}")
    preload = env.get("LD_PRELOAD", "")
    if any(f"lib{n}" in preload for n in ("tcmalloc", "jemalloc")):
        return None, ["allocator: the one in your LD_PRELOAD (kept)"], []
    if requested == "system":
        return None, ["allocator: the system's (glibc malloc), --allocator system"], []
    order = ("tcmalloc", "jemalloc") if requested == "auto" else (requested,)
    for name in order:
        if name in probe.libraries:
            return probe.libraries[name], [], []
    missing = " or ".join(order)
    note = (f"{missing} is not installed: the ranks use glibc malloc (install libtcmalloc-minimal4 or "
            "libjemalloc2, as torch.backends.xeon.run_cpu recommends)")
    if requested != "auto":
        note = f"--allocator {requested}: {note}"
    return None, ["allocator: glibc malloc (no tcmalloc/jemalloc found)"], [note]


def rank_runtime(plan: LaunchPlan, probe: RuntimeProbe, env: dict[str, str], *,
                 allocator: str = "auto", membind: bool = True) -> RankRuntime:
    """Per-rank variables and command prefix for ``plan`` on ``probe``'s machine.

    ``env`` is the environment the ranks inherit: what it already sets is kept. Returns the
    variables to add (``rank_entry`` applies them), the ``numactl`` prefix, and the lines
    the plan prints.
    """
    settings: list[str] = []
    notes: list[str] = []
    common: dict[str, str] = {}

    def put(name: str, value: str, why: str) -> None:
        if name in env and env[name] != value:
            settings.append(f"{name}={env[name]} (yours, kept; would be {value}: {why})")
        else:
            common[name] = value
            settings.append(f"{name}={value} ({why})")

    lib, lines, more = _allocator(probe, allocator, env)
    settings += lines
    notes += more
    if lib is not None:
        name = "tcmalloc" if "tcmalloc" in Path(lib).name else "jemalloc"
        preload = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
        common["LD_PRELOAD"] = preload
        settings.append(f"allocator: {name}, LD_PRELOAD={preload} (as run_cpu)")
        if name == "jemalloc":
            put("MALLOC_CONF", JEMALLOC_CONF, "run_cpu's jemalloc tuning")
    if probe.openmp == "intel":
        put("KMP_BLOCKTIME", "1", "Intel OpenMP: idle threads sleep after 1 ms")
        settings.append("KMP_AFFINITY=granularity=fine,explicit,proclist=[<rank's cpus>] (Intel OpenMP)"
                        if "KMP_AFFINITY" not in env else f"KMP_AFFINITY={env['KMP_AFFINITY']} (yours, kept)")
    else:
        label = {"gnu": "GNU libgomp", "llvm": "LLVM libomp"}.get(probe.openmp, "an unknown OpenMP runtime")
        settings.append(f"KMP_AFFINITY/KMP_BLOCKTIME not set: the ranks load {label}, which ignores them")

    per_rank: list[dict[str, str]] = []
    prefixes: list[tuple[str, ...]] = []
    for slot in plan.ranks:
        threads = rank_env(plan, slot.local_rank)
        out = dict(common)
        for name, value in threads.items():
            if name in USER_KEPT_VARS and name in env:
                continue  # the user's OMP_PLACES/OMP_PROC_BIND stay
            out[name] = value
        if probe.openmp == "intel" and "KMP_AFFINITY" not in env:
            out["KMP_AFFINITY"] = f"granularity=fine,explicit,proclist=[{threads['PROFILEDNN_CPUS']}]"
        per_rank.append(out)
        nodes = ",".join(str(n) for n in slot.numa_nodes)
        bind = membind and probe.numactl and plan.numa_nodes > 1
        prefixes.append((probe.numactl, f"--membind={nodes}", "--") if bind else ())
    for name in USER_KEPT_VARS:
        if name in env:
            settings.append(f"{name}={env[name]} (yours, kept)")
    for name in THREAD_COUNT_VARS:
        if name in env and env[name] != str(plan.threads_per_rank):
            notes.append(f"{name}={env[name]} in your environment is replaced by --threads-per-rank "
                         f"{plan.threads_per_rank}")

    if not membind:
        settings.append("memory: not bound (--no-membind); Linux places pages on first touch")
    elif plan.numa_nodes <= 1:
        settings.append("memory: one NUMA node, nothing to bind")
    elif probe.numactl:
        settings.append(f"memory: {probe.numactl} --membind=<rank's NUMA node(s)> (as run_cpu -m)")
    else:
        settings.append("memory: not bound; Linux places pages on first touch")
        notes.append(f"{probe.numactl_detail or 'numactl is not installed'}: each rank's memory is not bound "
                     "to its NUMA node (first touch on its pinned cores usually lands there); install numactl "
                     "for run_cpu's --membind")
    return RankRuntime(env=tuple(per_rank), prefix=tuple(prefixes), settings=tuple(settings), notes=tuple(notes))


__all__ = ["ALLOCATORS", "JEMALLOC_CONF", "RankRuntime", "RuntimeProbe", "detect_openmp", "find_library",
           "probe_runtime", "rank_runtime"]
