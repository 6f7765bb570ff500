"""The C build system of the hand-written kernels: each C file is compiled once per machine
with the system's C compiler into ``<cache>/kernels/`` (see ``profilednn.cache``) and
loaded with ctypes.

Used by the fused LAMB step (``kernels/lamb.c``), the fused focal loss
(``kernels/focal_loss.c``) and the verbose parser's first pass (``verbose/scan_lines.c``,
built with :func:`build` and loaded without PyTorch: it uses no OpenMP). This module
imports no PyTorch (only :func:`load` does, when called), so ``verbose/`` may use it. The
shared library's name hashes the source, the flags (the ISA of the detected CPU, from
``profilednn.topology``) and the compiler's version, so an edit, another CPU or another
compiler builds afresh. OpenMP comes from the libgomp PyTorch has already loaded, so a
kernel and PyTorch share one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..cache import cache_dir
from ..errors import ProfileDNNError
from ..topology import CpuTopology, capped_isa, detected_topology

# -fno-trapping-math: FP exceptions are never inspected, and without it GCC keeps compares
# and selects as branches, which stops the vectoriser (a kernel then runs scalar).
BASE_FLAGS = ("-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")


class NativeKernelUnavailable(ProfileDNNError):
    """A hand-written kernel could not be built or loaded here (no compiler, build error)."""


# ATen's own vector-ISA cap (ATEN_CPU_CAPABILITY) -> the oneDNN level our kernels then stay within,
# so a process that runs ATen's AVX2 kernels runs ours built for AVX2 too.
ATEN_CAPABILITY_LEVEL = {"default": "SSE41", "avx2": "AVX2"}


def isa_flags(topology: CpuTopology | None = None) -> list[str]:
    """The vector-ISA compiler flags for ``topology`` (this CPU by default, within
    ``ATEN_CPU_CAPABILITY`` when it is ``avx2`` or ``default``): AVX2, FMA, AVX-512 where the
    CPU has them, else none (the portable baseline)."""
    # the silicon's own flags, never an injected CPU's (PROFILEDNN_CPU_FLAGS): code built
    # for an ISA this CPU lacks dies with SIGILL
    isa = (topology or detected_topology()).isa
    level = ATEN_CAPABILITY_LEVEL.get(os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower())
    if topology is None and level:
        isa = capped_isa(isa, level)
    flags = []
    if "avx2" in isa:
        flags.append("-mavx2")
    if "fma" in isa:
        flags.append("-mfma")
    if "avx512f" in isa:
        flags.append("-mavx512f")
        if "avx512bw" in isa:
            flags.append("-mavx512bw")
        if "avx512vl" in isa:
            flags.append("-mavx512vl")
    return flags


def compiler() -> str:
    """``$CC``, else ``gcc``/``cc`` from PATH."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise NativeKernelUnavailable("no C compiler found (install gcc, or set CC)")
    return cc


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _sources_of(source: Path) -> list[str]:
    """The text of ``source`` and of the local headers it includes (``#include "x.h"``, next
    to it), so that editing a shared header builds every kernel that uses it afresh."""
    text = source.read_text()
    headers = sorted(set(_LOCAL_INCLUDE.findall(text)))
    return [text, *((source.parent / h).read_text() for h in headers if (source.parent / h).is_file())]


def build(source: Path, *, topology: CpuTopology | None = None) -> Path:
    """Compile ``source`` (a C file) into the cache once, for ``topology``'s ISA (this CPU
    by default), and return the shared library's path."""
    cc = compiler()
    flags = [*BASE_FLAGS, *isa_flags(topology)]
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeKernelUnavailable(f"C compiler {cc!r} does not run: {exc}") from exc
    key = hashlib.sha256("\0".join([*_sources_of(source), " ".join(flags), version]).encode()).hexdigest()[:16]
    out_dir = cache_dir() / "kernels"
    target = out_dir / f"{source.stem}-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeKernelUnavailable(
                f"building {source.name} with {cc} failed: {done.stderr.strip()[-800:] or done.returncode}")
        os.replace(tmp, target)  # atomic: a concurrent builder sees the whole library or none
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load(source: Path) -> ctypes.CDLL:
    """Build ``source`` for this CPU (once) and load it, after PyTorch so that the kernel
    binds to the libgomp PyTorch already loaded."""
    import torch  # noqa: F401  - its libgomp must be loaded first, so the kernel shares it

    path = build(source)
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeKernelUnavailable(f"cannot load {path}: {exc}") from exc


__all__ = ["BASE_FLAGS", "NativeKernelUnavailable", "build", "compiler", "isa_flags", "load"]
