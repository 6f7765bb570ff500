"""The registry of built-in workloads: list them, check knobs, build one.

``build_workload`` resolves every knob (defaults + what the caller gave), rejects
impossible values with an actionable WorkloadError, seeds torch, and hands the resolved
config to the family's ``build`` function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..builtin_workloads import check_workload_name
from ..errors import WorkloadError
from . import detection, recurrent, small, transformer, vision
from ..train_step import TrainStep
from .base import DTYPES, WorkloadSpec

_REGISTRY: dict[str, tuple[WorkloadSpec, Callable[[dict[str, Any]], TrainStep]]] = {
    spec.name: (spec, build)
    for spec, build in [
        (small.SPEC, small.build),
        *[(spec, vision.build) for spec in vision.SPECS],
        (detection.SPEC, detection.build),
        (transformer.SPEC, transformer.build),
        (recurrent.SPEC, recurrent.build),
    ]
}


def list_workloads() -> list[WorkloadSpec]:
    """Every built-in workload, in registry order."""
    return [spec for spec, _ in _REGISTRY.values()]


def get_spec(name: str) -> WorkloadSpec:
    """The spec of workload ``name``; WorkloadError listing the choices when unknown."""
    return _REGISTRY[check_workload_name(name)][0]


def build_workload(
    name: str,
    *,
    batch_size: int | None = None,
    image_size: int | None = None,
    seq_len: int | None = None,
    num_classes: int | None = None,
    channels_last: bool = False,
    dtype: str = "fp32",
    seed: int = 0,
    **knobs: Any,
) -> TrainStep:
    """Build workload ``name`` with random weights and a seeded synthetic data pool: its
    training state (``TrainStep``), which records ``name`` and these arguments
    (``build_args``) so another process can build it again.

    ``batch_size``/``image_size``/``seq_len``/``num_classes`` and ``**knobs`` override the
    workload's defaults (``list_workloads()`` shows them); a knob the workload does not
    take is an error. ``dtype="bf16"`` runs forward under CPU BF16 autocast (loss in
    fp32); ``channels_last`` applies to image models and is noted as ignored otherwise.
    Two builds with the same arguments give identical weights and data; torch's global
    RNG (which dropout draws from) is seeded with ``seed`` too, so a fresh build followed
    by its steps repeats its losses exactly.
    """
    spec = get_spec(name)
    given = dict(knobs)
    for knob, value in (
        ("batch_size", batch_size),
        ("image_size", image_size),
        ("seq_len", seq_len),
        ("num_classes", num_classes),
    ):
        if value is not None:
            given[knob] = value
    config = resolve_config(spec, given, channels_last=channels_last, dtype=dtype, seed=seed)
    torch.manual_seed(seed)
    state = _REGISTRY[name][1](config)
    state.build_args = {**given, "channels_last": channels_last, "dtype": dtype, "seed": seed}
    return state


def resolve_config(
    spec: WorkloadSpec, given: dict[str, Any], *, channels_last: bool, dtype: str, seed: int
) -> dict[str, Any]:
    """Defaults overridden by ``given``, every value checked; raises WorkloadError."""
    unknown = sorted(set(given) - set(spec.knobs))
    if unknown:
        raise WorkloadError(
            f"{spec.name} does not take {', '.join(unknown)}; "
            f"its knobs are: {', '.join(spec.knobs)} (and dtype, channels_last, seed)"
        )
    if dtype not in DTYPES:
        raise WorkloadError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if not isinstance(channels_last, bool):
        raise WorkloadError(f"channels_last must be true or false, got {channels_last!r}")
    if not _is_int(seed) or seed < 0:
        raise WorkloadError(f"seed must be a non-negative integer, got {seed!r}")

    config: dict[str, Any] = {"name": spec.name}
    for knob in spec.knobs:
        config[knob] = _checked(spec, knob, given.get(knob, spec.defaults[knob]))
    config.update(dtype=dtype, channels_last=channels_last, seed=seed, notes=[])
    return config


def _checked(spec: WorkloadSpec, knob: str, value: Any) -> Any:
    """``value`` converted to the default's type and checked against the knob's range."""
    default = spec.defaults[knob]
    where = f"{spec.name}: {knob}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise WorkloadError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, int):
        if not _is_int(value):
            raise WorkloadError(f"{where} must be an integer, got {value!r}")
        value = int(value)
        low, high = spec.ranges.get(knob, (1, None))
    else:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WorkloadError(f"{where} must be a number, got {value!r}")
        value = float(value)
        low, high = spec.ranges.get(knob, (None, None))
        if low is None and not value > 0:  # floats with no stated lower bound: rates, fractions
            raise WorkloadError(f"{where} must be > 0, got {value}")
    if knob == "image_size" and spec.min_image_size is not None:
        low = max(low or 0, spec.min_image_size)
        if value < low:
            raise WorkloadError(
                f"{where} must be >= {low} for this model (got {value}); "
                f"pass image_size={low} or more"
            )
    if low is not None and value < low:
        raise WorkloadError(f"{where} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise WorkloadError(f"{where} must be <= {high}, got {value}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
