"""What oneDNN's verbose dialects look like: markers, line classes, names and mappings.

One place for the vocabulary every other module of ``verbose`` shares. A verbose line is
``<marker>,[vN,][timestamp,][vN,][component,]<event>,<body...>``; which of the optional
header fields appear tells the dialect apart:

========================  =====================================================
``mkldnn_v0``             ``mkldnn_verbose,exec,convolution,...`` (MKL-DNN 0.x, no engine)
``dnnl_v1``               ``dnnl_verbose,[ts,]exec,cpu,...`` (DNNL 1.x - oneDNN 2.4)
``onednn_v2.5``           ``onednn_verbose,[ts,]exec,cpu,...`` (2.5 - 3.1)
``onednn_v3.2``           as 2.5 plus ``create:check`` / ``create:dispatch`` lines and
                          memory descriptors with a strides field (``src_f32::blocked:ab::f0``)
``onednn_v3.3``           ``onednn_verbose,[ts,]primitive,exec,...`` (3.3 - 3.5)
``onednn_v3.6``           ``onednn_verbose,v1,[ts,]primitive,exec,...`` (3.6 and later)
========================  =====================================================
"""

from __future__ import annotations

import re

from .markers import MARK_LINE_PREFIX

# -- markers ---------------------------------------------------------------------------
# (marker text including its comma, marker id). Order matters for prefix matching:
# the graph markers come before their shorter primitive siblings.
MARKERS: tuple[tuple[bytes, int], ...] = (
    (b"onednn_graph_verbose,", 4),
    (b"dnnl_graph_verbose,", 5),
    (b"onednn_verbose,", 3),
    (b"dnnl_verbose,", 2),
    (b"mkldnn_verbose,", 1),
)
MARKER_MKLDNN, MARKER_DNNL, MARKER_ONEDNN, MARKER_ONEDNN_GRAPH, MARKER_DNNL_GRAPH = 1, 2, 3, 4, 5
GRAPH_MARKERS = (MARKER_ONEDNN_GRAPH, MARKER_DNNL_GRAPH)

# ProfileDNN's own marker lines (their format: markers.py); counted and skipped.
PROFILEDNN_MARK = MARK_LINE_PREFIX


def prefix_code(marker, has_version):  # ints or NumPy arrays
    """Pack the header facts a line's key does not keep (marker, ``vN`` field) into one int."""
    return marker * 100 + has_version * 10


def unpack_prefix(code: int) -> tuple[int, bool]:
    return code // 100, bool((code // 10) % 10)

# Header components of oneDNN >= 3.3 (``primitive,exec,...``).
COMPONENT_NAMES = ("", "primitive", "graph", "common", "ukernel")

# -- dialects --------------------------------------------------------------------------
DIALECTS: tuple[str, ...] = (
    "mkldnn_v0", "dnnl_v1", "onednn_v2.5", "onednn_v3.2", "onednn_v3.3", "onednn_v3.6",
)

# -- line classes (ParseReport keys) ---------------------------------------------------
PRIMITIVE = "primitive"      # exec / create:* line that describes a primitive (a table row)
INFO = "info"                # version, runtime, ISA, ... header lines
TEMPLATE = "template"        # info lines that print the field template
GRAPH = "graph"              # graph-API lines (partitions, compiled partitions)
ERROR = "error"              # error / warning lines
DISPATCH = "dispatch"        # create:check, create:dispatch, exec:check: diagnostics, no timing
OTHER = "other_verbose"      # a verbose line of a kind not listed above (ukernel, profile ...)
MARKER = "marker"            # profilednn_mark lines
FOREIGN = "foreign"          # program output interleaved with the log (incl. blank lines)
MALFORMED = "malformed"      # looked like a primitive line but could not be read
LINE_CLASSES: tuple[str, ...] = (
    PRIMITIVE, INFO, TEMPLATE, GRAPH, ERROR, DISPATCH, OTHER, MARKER, FOREIGN, MALFORMED,
)

_ERROR_EVENTS = ("error", "warn", "warning")
_DISPATCH_EVENTS = ("create:check", "create:dispatch", "exec:check")


def classify_event(event: str, component: str, payload: str) -> str:
    """The line class of a verbose line from its event, component and first body field."""
    if component == "graph":
        return GRAPH
    base = event.split(":", 1)[0]
    if event == "info" or base == "info":
        return TEMPLATE if payload.startswith(("template:", "prim_template:", "graph_template:")) else INFO
    if base in _ERROR_EVENTS or event.startswith(("error", "warn")):
        return ERROR
    if event in _DISPATCH_EVENTS or event.endswith((":check", ":dispatch")):
        return DISPATCH
    if component in ("common", "ukernel"):
        return OTHER
    if event == "exec" or base == "create" or event.startswith("create"):
        return PRIMITIVE
    return OTHER


# -- primitive kinds -> benchdnn drivers ----------------------------------------------
PRIM_KIND_TO_DRIVER: dict[str, str] = {
    "convolution": "conv",
    "deconvolution": "deconv",
    "inner_product": "ip",
    "matmul": "matmul",
    "gemm_api": "matmul",    # oneDNN's sgemm/gemm API calls (dnnl_sgemm ...), printed as M x K : K x N
    "gemm": "matmul",        # internal GEMM a primitive creates (create_nested lines)
    "eltwise": "eltwise",
    "batch_normalization": "bnorm",
    "layer_normalization": "lnorm",
    "group_normalization": "gnorm",
    "pooling": "pool",
    "pooling_v2": "pool",
    "reorder": "reorder",
    "sum": "sum",
    "concat": "concat",
    "binary": "binary",
    "softmax": "softmax",
    "softmax_v2": "softmax",
    "logsoftmax": "softmax",
    "rnn": "rnn",
    "lrn": "lrn",
    "shuffle": "shuffle",
    "resampling": "resampling",
    "reduction": "reduction",
    "prelu": "prelu",
    "zero_pad": "zeropad",
    "sdpa": "sdpa",
}

PROP_KINDS: frozenset[str] = frozenset({
    "forward_training", "forward_inference", "forward_scoring", "forward", "backward",
    "backward_data", "backward_weights", "backward_bias", "undef",
})

_BASE_DIRECTION = {
    "forward_training": "FWD_D",
    "forward": "FWD_D",
    "forward_inference": "FWD_I",
    "forward_scoring": "FWD_I",
    "backward_data": "BWD_D",
    "backward_weights": "BWD_W",
    "backward_bias": "BWD_W",
    "backward": "BWD_DW",
}

# Drivers whose direction gains a bias flavour (FWD_B, BWD_WB) when a bias tensor exists.
BIAS_DRIVERS = frozenset({"conv", "deconv", "ip"})


def benchdnn_direction(prop_kind: str | None, driver: str | None, has_bias: bool) -> str | None:
    """benchdnn's ``--dir`` for a primitive (None where benchdnn has no direction)."""
    base = _BASE_DIRECTION.get(prop_kind or "")
    if base is None:
        return None
    if driver in BIAS_DRIVERS and has_bias:
        if base in ("FWD_D", "FWD_I"):
            return "FWD_B"
        if base == "BWD_W":
            return "BWD_WB"
    return base


# -- ISA from the implementation name -------------------------------------------------
_CPU_ISA_TOKEN = re.compile(r"^(?:avx(?:\d+)?(?:_[a-z0-9]+)*|sse4[12]|sve_\d+|asimd|amx(?:_[a-z0-9]+)*)$")
_GPU_ARCH_TOKEN = re.compile(r"^(?:gen\d+\w*|xe\w*|xehp\w*|xehpg\w*|xelp\w*)$")


def isa_of(impl: str | None, engine: str | None = "cpu") -> str | None:
    """The instruction set an implementation name names (``jit:avx2`` -> ``avx2``).

    ``uni`` means a JIT kernel generated for the best ISA found at run time (``jit:uni``,
    ``jit:blk``, ``x64:gemm:jit``); ``any`` covers reference and ``simple`` code. GPU
    implementations give their architecture when named (``gen9``, ``xe_hp``), else ``gpu``.
    """
    if not impl:
        return None
    tokens = re.split(r"[:+]", impl)
    if engine and engine.startswith("gpu"):
        return next((t for t in tokens if _GPU_ARCH_TOKEN.match(t)), "gpu")
    found = next((t for t in tokens if _CPU_ISA_TOKEN.match(t)), None)
    if found:
        return found
    words = set(re.split(r"[:+_]", impl))
    if "uni" in words or "jit" in words:
        return "uni"
    return "any"


# -- data types ------------------------------------------------------------------------
DT_BYTES: dict[str, float] = {
    "f64": 8, "f32": 4, "s32": 4, "tf32": 4, "f16": 2, "bf16": 2,
    "s16": 2, "u16": 2, "s8": 1, "u8": 1, "boolean": 1,
    "f8_e5m2": 1, "f8_e4m3": 1, "e8m0": 1, "s4": 0.5, "u4": 0.5, "f4_e2m1": 0.5,
    "f4_e3m0": 0.5, "nf4": 0.5,
}
_DT_RE = re.compile(r"^(?:undef|[bf]?f\d+(?:_e\d+m\d+)?|[su]\d+|e\d+m\d+|tf32|nf4|boolean|bin)$")


def is_data_type(text: str) -> bool:
    """Whether ``text`` names a oneDNN data type (f32, bf16, s8, f8_e5m2, undef, ...)."""
    return bool(_DT_RE.match(text))
