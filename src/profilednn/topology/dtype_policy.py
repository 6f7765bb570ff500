"""Which reduced-precision dtypes a CPU computes natively, and whether one pays there.

"Native" is not "faster": :func:`dtype_speed` says whether bf16 or fp16 pays on a CPU (a
measured GEMM peak above fp32's, or, unmeasured, a matrix unit), with the reason; every
job that advises, projects or tries a dtype as a speed-up asks it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ..errors import InputError

# Reduced-precision dtypes, the ISA flags that compute each natively, and its matrix unit.
REDUCED_DTYPES = ("bf16", "fp16")
BF16_VECTOR_FLAG = "avx512_bf16"  # native BF16 dot products in AVX-512 (Zen 4, Cooper Lake, Sapphire Rapids)
BF16_MATRIX_FLAG = "amx_bf16"  # BF16 on AMX tiles (Sapphire Rapids and later)
DTYPE_ISA = {"bf16": (BF16_VECTOR_FLAG, BF16_MATRIX_FLAG), "fp16": ("avx512_fp16", "amx_fp16")}
MATRIX_UNIT = {"bf16": BF16_MATRIX_FLAG, "fp16": "amx_fp16"}
# The one answer to "is BF16 native here" (the fingerprint, the advice and the dtype speed
# all ask it here). avx_ne_convert does not count: AVX-NE-CONVERT only converts between BF16
# and fp32, and oneDNN's BF16 compute kernels need AVX512_CORE_BF16 (avx512_bf16) or AMX
# (amx_bf16); without them oneDNN emulates BF16.
NATIVE_BF16_FLAGS: frozenset[str] = frozenset(DTYPE_ISA["bf16"])
# The ISA flags a Run's fingerprint records (ISA_FLAGS and sse4_1, avx512dq), in the order
# Runs have always stored them.
FINGERPRINT_ISA_FLAGS = (
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", BF16_VECTOR_FLAG,
    "avx512_fp16", "avx_vnni", "amx_tile", BF16_MATRIX_FLAG, "amx_int8", "amx_fp16",
)
# A measured GEMM peak must beat fp32's by this much to pay for the dtype's rounding
# (fp16 on the Intel AMX guest: 341 vs 375 GFLOP/s, 0.91x; bf16 on Zen 4: 2.2x).
MIN_GEMM_SPEEDUP = 1.1


@dataclass(frozen=True)
class DtypeSpeed:
    """Whether computing in a reduced-precision dtype pays on a CPU, and why.

    ``basis``: ``measured`` (GEMM peaks decided), ``matrix unit`` (AMX for it, nothing
    measured), ``unmeasured`` (vector ISA only, no peak to show it beats fp32) or ``emulated``.
    """

    dtype: str
    faster: bool
    basis: str
    reason: str


def dtype_speed(dtype: str, isa: Collection[str], peaks: Mapping[str, float] | None = None) -> DtypeSpeed:
    """Whether ``dtype`` (bf16 or fp16) pays on a CPU with ``isa`` flags and measured GEMM
    ``peaks`` (GFLOP/s per dtype, fp32 included; None when not measured).

    Measured peaks decide: it pays where its GEMM peak beats fp32's by
    :data:`MIN_GEMM_SPEEDUP`. Unmeasured, it pays where the ISA has a matrix unit for it
    (amx_bf16, amx_fp16); a vector ISA alone does not say (avx512_fp16 on the Intel AMX
    guest ran fp16 GEMM slower than fp32).
    """
    if dtype not in REDUCED_DTYPES:
        raise InputError(f"{dtype!r} is not a reduced-precision dtype; ask about one of "
                         f"{', '.join(REDUCED_DTYPES)}")
    peaks, flags = peaks or {}, {str(f).lower() for f in isa}
    if peaks.get(dtype) and peaks.get("fp32"):
        return _measured_speed(dtype, float(peaks[dtype]), float(peaks["fp32"]))
    if MATRIX_UNIT[dtype] in flags:
        return DtypeSpeed(dtype, True, "matrix unit", f"{MATRIX_UNIT[dtype]}: a matrix unit computes {dtype}")
    vector = [f for f in DTYPE_ISA[dtype] if f in flags]
    if vector:
        return DtypeSpeed(dtype, False, "unmeasured",
                          f"{', '.join(vector)} computes {dtype} in vector units, but no {dtype} GEMM peak "
                          "was measured to show it beats fp32 (`profilednn machine` measures it)")
    return DtypeSpeed(dtype, False, "emulated",
                      f"no native {dtype} (no {' or '.join(DTYPE_ISA[dtype])}): it would be emulated, "
                      "many times slower than fp32")


def _measured_speed(dtype: str, peak: float, fp32: float) -> DtypeSpeed:
    ratio = peak / fp32
    text = f"measured {dtype} GEMM {peak:,.0f} vs fp32 {fp32:,.0f} GFLOP/s ({ratio:.2f}x)"
    if ratio < MIN_GEMM_SPEEDUP:
        text += f": below the {MIN_GEMM_SPEEDUP:.1f}x that pays for its rounding"
    return DtypeSpeed(dtype, ratio >= MIN_GEMM_SPEEDUP, "measured", text)


def bf16_tier(isa: Collection[str]) -> str:
    """What the CPU computes BF16 GEMMs with: "amx" (a matrix unit), "avx512_bf16" (vector
    instructions only) or "none" (emulated) -- the class the speed targets are set per."""
    if MATRIX_UNIT["bf16"] in isa:
        return "amx"
    native = [f for f in DTYPE_ISA["bf16"] if f in isa]
    return native[0] if native else "none"


def has_native_bf16(isa: Collection[str]) -> bool:
    """Whether a CPU with ``isa`` flags computes BF16 natively (:data:`NATIVE_BF16_FLAGS`);
    without it oneDNN emulates BF16 and training runs many times slower than fp32."""
    return bool(NATIVE_BF16_FLAGS & {str(f).lower() for f in isa})


def faster_dtypes(isa: Collection[str], peaks: Mapping[str, float] | None = None) -> dict[str, str]:
    """``{dtype: reason}`` for each reduced-precision dtype that pays (see :func:`dtype_speed`)."""
    speeds = (dtype_speed(d, isa, peaks) for d in REDUCED_DTYPES)
    return {s.dtype: s.reason for s in speeds if s.faster}


__all__ = ["BF16_MATRIX_FLAG", "BF16_VECTOR_FLAG", "FINGERPRINT_ISA_FLAGS", "NATIVE_BF16_FLAGS", "has_native_bf16", "DTYPE_ISA", "DtypeSpeed", "MATRIX_UNIT", "MIN_GEMM_SPEEDUP", "REDUCED_DTYPES", "bf16_tier",
           "dtype_speed", "faster_dtypes"]
