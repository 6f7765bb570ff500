"""oneDNN's own cap on the ISA it dispatches to (``ONEDNN_MAX_CPU_ISA``), and the flags it
takes away: software, not injection, so the CPU every job sees has them removed."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

from .dtype_policy import BF16_MATRIX_FLAG, BF16_VECTOR_FLAG

# oneDNN's own cap on the ISA it dispatches to (the newer name first, as oneDNN reads them).
ENV_ONEDNN_MAX_ISA = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# oneDNN's ISA levels as its ``dnnl_cpu_isa_t`` bit masks: a kernel for an ISA may run under a
# cap when every bit of the ISA's mask is in the cap's (the levels are not a total order:
# AVX512_CORE lacks AVX2_VNNI's bit). DEFAULT and ALL lift the cap.
ONEDNN_ISA_MASKS = {
    "SSE41": 0x1, "AVX": 0x3, "AVX2": 0x7, "AVX2_VNNI": 0xF, "AVX2_VNNI_2": 0x1F, "AVX512_CORE": 0x27,
    "AVX512_CORE_VNNI": 0x67, "AVX512_CORE_BF16": 0xE7, "AVX10_1_512": 0x1EF, "AVX512_CORE_FP16": 0x1EF,
    "AVX10_1_512_AMX": 0xFEF, "AVX512_CORE_AMX": 0xFEF, "AVX10_1_512_AMX_FP16": 0x1FEF,
    "AVX512_CORE_AMX_FP16": 0x1FEF,
}
ONEDNN_NO_CAP = ("DEFAULT", "ALL")
# The oneDNN ISA level that each reported flag's kernels need (flags oneDNN's GEMM and
# convolution kernels are chosen by; the others are left as reported).
FLAG_ONEDNN_ISA = {
    "avx": "AVX", "avx2": "AVX2", "fma": "AVX2", "avx_vnni": "AVX2_VNNI", "avx512f": "AVX512_CORE",
    "avx512bw": "AVX512_CORE", "avx512vl": "AVX512_CORE", "avx512_vnni": "AVX512_CORE_VNNI",
    BF16_VECTOR_FLAG: "AVX512_CORE_BF16", "avx512_fp16": "AVX512_CORE_FP16", "amx_tile": "AVX512_CORE_AMX",
    BF16_MATRIX_FLAG: "AVX512_CORE_AMX", "amx_int8": "AVX512_CORE_AMX", "amx_fp16": "AVX512_CORE_AMX_FP16",
}


def onednn_isa_cap(env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(variable, LEVEL)`` when oneDNN's ISA is capped (``ONEDNN_MAX_CPU_ISA=avx2`` ->
    ``("ONEDNN_MAX_CPU_ISA", "AVX2")``); None when unset, ``DEFAULT``/``ALL``, or a value
    oneDNN does not know (it ignores those: see :func:`isa_cap_note`)."""
    env = os.environ if env is None else env
    for variable in ENV_ONEDNN_MAX_ISA:
        value = env.get(variable, "").strip().upper()
        if value:
            return (variable, value) if value in ONEDNN_ISA_MASKS else None
    return None


def capped_isa(isa: Collection[str], level: str) -> frozenset[str]:
    """``isa`` without the flags whose oneDNN kernels a cap at ``level`` forbids."""
    cap = ONEDNN_ISA_MASKS[level.upper()]
    return frozenset(f for f in isa
                     if f not in FLAG_ONEDNN_ISA or ONEDNN_ISA_MASKS[FLAG_ONEDNN_ISA[f]] & ~cap == 0)


__all__ = ["ENV_ONEDNN_MAX_ISA", "FLAG_ONEDNN_ISA", "ONEDNN_ISA_MASKS", "ONEDNN_NO_CAP", "capped_isa",
           "onednn_isa_cap"]
