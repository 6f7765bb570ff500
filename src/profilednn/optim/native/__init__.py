"""Hand-written CPU kernels, compiled once per machine with the system's C compiler and
loaded with ctypes: a fused LAMB step (``lamb.c``), for which stock PyTorch has no kernel.

The build goes to ``<cache>/kernels/`` (see ``profilednn.cache``) under a name that hashes
the source, the flags (ISA chosen from this CPU) and the compiler, so an edit, another CPU
or another compiler builds afresh. OpenMP comes from the libgomp PyTorch has already
loaded, so the kernel and PyTorch share one thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...cache import cache_dir
from ...errors import ProfileDNNError
from ...topology import cpu_topology

SOURCE_DIR = Path(__file__).resolve().parent


class NativeKernelUnavailable(ProfileDNNError):
    """A hand-written kernel could not be built or loaded here (no compiler, build error)."""


def _isa_flags() -> list[str]:
    isa = cpu_topology().isa
    flags = []
    if "avx2" in isa:
        flags.append("-mavx2")
    if "fma" in isa:
        flags.append("-mfma")
    if "avx512f" in isa:
        flags.append("-mavx512f")
    return flags


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise NativeKernelUnavailable("no C compiler found (install gcc, or set CC)")
    return cc


def build(name: str) -> Path:
    """Compile ``<name>.c`` into the cache (once) and return the shared library's path."""
    source = SOURCE_DIR / f"{name}.c"
    cc = _compiler()
    flags = ["-O3", "-std=gnu11", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", *_isa_flags()]
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise NativeKernelUnavailable(f"C compiler {cc!r} does not run: {exc}") from exc
    key = hashlib.sha256("\0".join([source.read_text(), " ".join(flags), version]).encode()).hexdigest()[:16]
    out_dir = cache_dir() / "kernels"
    target = out_dir / f"{name}-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, str(source), "-o", tmp, "-lm"], capture_output=True, text=True)
        if done.returncode != 0:
            raise NativeKernelUnavailable(
                f"building {source.name} with {cc} failed: {done.stderr.strip()[-800:] or done.returncode}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.lru_cache(maxsize=None)
def lamb_kernel() -> ctypes.CDLL:
    """The fused LAMB step, built and loaded on first use (``profilednn_lamb_step_f32``)."""
    import torch  # noqa: F401  - its libgomp must be loaded first, so the kernel shares it

    path = build("lamb")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise NativeKernelUnavailable(f"cannot load {path}: {exc}") from exc
    fn = lib.profilednn_lamb_step_f32
    ptrs = ctypes.POINTER(ctypes.c_void_p)
    f = ctypes.c_float
    fn.argtypes = [ctypes.c_int64, ptrs, ptrs, ptrs, ptrs, ctypes.POINTER(ctypes.c_int64),
                   f, f, f, f, f, f, f, f, f, ctypes.c_int]
    fn.restype = None
    return lib


__all__ = ["NativeKernelUnavailable", "build", "lamb_kernel"]
