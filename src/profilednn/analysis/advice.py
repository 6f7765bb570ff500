"""Advice: rules that turn a Run's findings into ranked recommendations.

Each rule looks at one thing, documents its threshold and how it estimates the gain,
and returns an :class:`Advice` (or ``None`` when it does not apply). Gains are
percentages of the mean step time (of oneDNN time for a bare log), estimated from the
Run's own measurements times a stated factor; they are estimates, not promises.

The rules live by concern (``model_rules``, ``environment_rules``, ``fragmentation_rules``,
``precision_rules``, ``conv_rules``, ``weight_grad_rules``, ``optimizer_rules``,
``dropout_rules``; ``rules.py`` lists them). This module holds the advice's JSON form and
keeps the names it always exported importable from here.
"""

from __future__ import annotations

from .environment_rules import (
    ALLOCATION_SAVING_US,
    ALLOCATIONS_PER_STEP_MIN,
    DATA_OVERLAP_SAVING,
    DATA_SHARE_MIN_PCT,
    FAULTS_STILL_FALLING,
    OVERSUBSCRIPTION_PENALTY,
    PAGE_FAULT_MS_PER_MIB,
    allocator,
    data_loading,
    threads_vs_cores,
)
from .fragmentation_rules import FRAGMENT_OP_SAVING, FRAGMENT_SHARE_MIN_PCT, fragmentation
from .model_rules import (
    BATCHNORM_FUSION_SAVING,
    BATCHNORM_OPS,
    BATCHNORM_SHARE_MIN_PCT,
    BF16_SHARE_MIN_PCT,
    EMULATED_BF16_SLOWDOWN,
    FROZEN_BN_FUSION_SAVING,
    FROZEN_BN_MIN_ELEMENTWISE_PER_CALL,
    FROZEN_BN_MIN_PCT,
    FROZEN_WEIGHT_GRAD_MIN_PCT,
    LOSS_FUSION_SAVING,
    LOSS_SHARE_MIN_PCT,
    NCHW_REORDER_MIN_PCT,
    RELU_OPS,
    REORDER_SHARE_MIN_PCT,
    REORDER_SHARE_OF_ONEDNN_MIN_PCT,
    WEIGHT_GRAD_SHARE_OF_BACKWARD,
    batchnorm_passes,
    bf16_without_native_bf16,
    channels_last,
    frozen_batchnorm_unfused,
    frozen_weight_grads,
    fused_loss,
)
from .rulebook import (
    NATIVE_BF16_FLAGS,
    Advice,
    Rule,
    native_bf16,
    severity_for,
)


def advice_json(advice: list[Advice]) -> list[dict[str, object]]:
    """The advice as plain objects (``rule``, ``severity``, ``evidence``,
    ``estimated_gain_pct``, ``action``) for ``--json``."""
    return [a.to_dict() for a in advice]



__all__ = [
    "Advice",
    "NATIVE_BF16_FLAGS",
    "Rule",
    "advice_json",
    "native_bf16",
    "severity_for",
    # the rules and their thresholds, now in model_rules, environment_rules and fragmentation_rules
    "ALLOCATIONS_PER_STEP_MIN", "ALLOCATION_SAVING_US", "BATCHNORM_FUSION_SAVING", "BATCHNORM_OPS",
    "BATCHNORM_SHARE_MIN_PCT", "BF16_SHARE_MIN_PCT", "DATA_OVERLAP_SAVING", "DATA_SHARE_MIN_PCT",
    "EMULATED_BF16_SLOWDOWN", "FAULTS_STILL_FALLING", "FRAGMENT_OP_SAVING", "FRAGMENT_SHARE_MIN_PCT",
    "FROZEN_BN_FUSION_SAVING", "FROZEN_BN_MIN_ELEMENTWISE_PER_CALL", "FROZEN_BN_MIN_PCT", "FROZEN_WEIGHT_GRAD_MIN_PCT",
    "LOSS_FUSION_SAVING", "LOSS_SHARE_MIN_PCT", "NCHW_REORDER_MIN_PCT", "OVERSUBSCRIPTION_PENALTY",
    "PAGE_FAULT_MS_PER_MIB", "RELU_OPS", "REORDER_SHARE_MIN_PCT", "REORDER_SHARE_OF_ONEDNN_MIN_PCT",
    "WEIGHT_GRAD_SHARE_OF_BACKWARD", "allocator", "batchnorm_passes", "bf16_without_native_bf16", "channels_last",
    "data_loading", "fragmentation", "frozen_batchnorm_unfused", "frozen_weight_grads", "fused_loss",
    "threads_vs_cores",
]
