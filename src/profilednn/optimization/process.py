"""``allocator``: jemalloc or tcmalloc through LD_PRELOAD, else glibc's own malloc told to
keep freed memory (GLIBC_TUNABLES).

It acts only when a process starts (the dynamic loader reads LD_PRELOAD), so it cannot be
switched on in the running process: ``optimize`` measures it in child processes (``python
-m profilednn.optimization.child``), each rebuilding the setup, and reports the environment
to launch training with when it wins (``LaunchRecipe``). ``threads.py`` is the other
process-level recipe.
"""

from __future__ import annotations

import ctypes.util
import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ..capture.fingerprint import glibc_caching
from .recipe_contract import Context, LaunchRecipe

LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
    "/usr/local/lib", "/lib/x86_64-linux-gnu", "/lib64",
)
# (label, file names), in order of preference.
ALLOCATORS = (
    ("jemalloc", ("libjemalloc.so.2", "libjemalloc.so")),
    ("tcmalloc", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so")),
)
# PyTorch's CPU performance guide: keep freed memory cached instead of returning it at once.
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
INSTALL_HINT = "apt-get install libjemalloc2 (or libtcmalloc-minimal4) to try it"
# glibc serves every buffer above its mmap threshold (at most 32 MiB) with a fresh mmap and
# unmaps it on free, so each step page-faults its large activations and gradients in again
# (a 51 MB batch-norm output: ~3x the time of its arithmetic on a 2-core EPYC). With no
# mmap and no trimming, freed memory stays in the heap: what jemalloc's dirty_decay_ms:-1
# does, with nothing to install. PyTorch asks for 64-byte alignment, and glibc's memalign
# path then reuses a freed large block only now and then; THP_MEM_ALLOC_ENABLE=1 makes
# PyTorch align buffers of 2 MiB and more to 2 MiB (and ask for transparent huge pages),
# which glibc reuses every time. The price: the process keeps its peak RSS.
GLIBC_CACHING = {"glibc.malloc.mmap_max": "0", "glibc.malloc.trim_threshold": str(2**40)}
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def transparent_huge_pages() -> bool:
    """Whether the kernel grants transparent huge pages to ``madvise`` (mode always or madvise)."""
    try:
        return "[never]" not in THP_SETTING.read_text()
    except OSError:
        return False


def is_glibc() -> bool:
    """Whether this process's C library is glibc (musl has no tunables)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (ValueError, OSError):  # the name is unknown outside glibc
        return False


def glibc_tunables(current: str, settings: dict[str, str]) -> str:
    """``GLIBC_TUNABLES`` with ``settings`` added to (or replacing the same names in) ``current``."""
    kept = [item for item in current.split(":") if item and item.split("=", 1)[0] not in settings]
    return ":".join(kept + [f"{k}={v}" for k, v in settings.items()])


@functools.cache
def find_allocator() -> tuple[str, str] | None:
    """(label, path) of the first jemalloc or tcmalloc shared library found, or None; looked
    up once a process (``ctypes.util.find_library`` runs ``ldconfig -p``, ~40 ms here, and the
    search asks whether the allocator applies before every A/B to plan its time)."""
    dirs = [*LIBRARY_DIRS, str(Path(sys.prefix) / "lib")]
    for label, names in ALLOCATORS:
        for d in dirs:
            for name in names:
                path = Path(d) / name
                if path.is_file():
                    return label, str(path)
        found = ctypes.util.find_library(label if label == "jemalloc" else "tcmalloc_minimal")
        if found:
            return label, found
    return None


def preloaded_allocator(env: Mapping[str, str] | None = None) -> str | None:
    preload = (env if env is not None else os.environ).get("LD_PRELOAD", "")
    for label, _ in ALLOCATORS:
        if label in preload:
            return label
    return None


class Allocator(LaunchRecipe):
    name = "allocator"
    family = "runtime"
    summary = ("a caching allocator: jemalloc, else tcmalloc (LD_PRELOAD), else glibc keeping freed "
               "memory (GLIBC_TUNABLES)")

    def launch_check(self, ctx: Context, env: Mapping[str, str]) -> str | None:
        if not sys.platform.startswith("linux"):
            return "LD_PRELOAD allocators are set up for Linux only"
        already = preloaded_allocator() or preloaded_allocator(env)
        if already:
            return f"{already} is already preloaded"
        if find_allocator() is None:
            if not is_glibc():
                return f"neither jemalloc nor tcmalloc is installed ({INSTALL_HINT}) and the C library is not glibc"
            if glibc_caching() or glibc_caching(dict(env)):
                return "glibc already keeps freed memory (glibc.malloc.mmap_max=0)"
        return None

    def launch_environment(self, ctx: Context, env: Mapping[str, str]) -> tuple[dict[str, str], str]:
        found = find_allocator()
        added: dict[str, str] = {}
        if found is None:
            current = env.get("GLIBC_TUNABLES", os.environ.get("GLIBC_TUNABLES", ""))
            added["GLIBC_TUNABLES"] = glibc_tunables(current, GLIBC_CACHING)
            how = f"GLIBC_TUNABLES={added['GLIBC_TUNABLES']}"
            if transparent_huge_pages():
                added["THP_MEM_ALLOC_ENABLE"] = "1"
                how += " THP_MEM_ALLOC_ENABLE=1"
            return added, (f"{how} (neither jemalloc nor tcmalloc is installed: glibc keeps freed memory instead of "
                           f"unmapping it and faulting it back in every step; {INSTALL_HINT})")
        label, path = found
        previous = os.environ.get("LD_PRELOAD", "")
        added["LD_PRELOAD"] = f"{path}:{previous}" if previous else path
        how = f"LD_PRELOAD={path}"
        if label == "jemalloc":
            added["MALLOC_CONF"] = JEMALLOC_CONF
            how += f" MALLOC_CONF={JEMALLOC_CONF}"
        return added, how


RECIPE = Allocator()
