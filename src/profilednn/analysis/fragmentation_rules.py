"""The fragmentation advice rule: long stretches of many short ops (fusion candidates, found
by ``analysis/fragmentation.py``) that a fused kernel, ``torch.compile`` or a fused
optimizer would run as one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..recipe_catalogue import FUSED_OPTIMIZER
from .rulebook import Advice, rule, severity_for

if TYPE_CHECKING:
    from .view import RunView


# ------------------------------------------------------------------------- fragmentation
FRAGMENT_SHARE_MIN_PCT = 5.0
FRAGMENT_OP_SAVING = 0.5  # a fused kernel: no gaps, about half the memory passes


@rule("fragmentation")
def fragmentation(a: "RunView") -> Advice | None:
    """Long stretches of many short ops (fusion candidates) take a share of the step.

    Gain: the gaps between those ops (dispatch overhead a fused kernel removes) plus
    half the ops' own time (elementwise chains are memory bound: one pass, not many).
    """
    if a.op_events is None or not a.step_ms:
        return None
    frags = a.fragments()
    if frags.height == 0:
        return None
    span = float(frags["span_ms"].sum()) / a.n_steps
    share = span / a.step_ms * 100.0
    if share < FRAGMENT_SHARE_MIN_PCT:
        return None
    gaps = float(frags["gap_ms"].sum()) / a.n_steps
    ops = float(frags["op_ms"].sum()) / a.n_steps
    gain = (gaps + FRAGMENT_OP_SAVING * ops) / a.step_ms * 100.0
    top = frags.row(0, named=True)
    where = top["module"] or top["parent"]
    in_optimizer = top["phase"] == "optimizer"  # a per-parameter update loop: fused=True, not a compiler
    action = (f"Fuse the optimizer's per-parameter loop in {where}: construct torch's optimizer with fused=True "
              "(Adam/AdamW/SGD/Adagrad on CPU) or foreach=True, or use a fused implementation."
              if in_optimizer else
              f"Fuse the chain in {where}: torch.compile that module or function (its elementwise "
              "chains become one generated kernel), or write one kernel for it; optimizer chains "
              "go away with fused=True.")
    return Advice(
        rule="fragmentation",
        severity=severity_for(gain),
        evidence=(
            f"{frags.height / a.n_steps:.0f} stretch(es) of short ops per step cost {span:.2f} ms "
            f"({share:.1f}% of the step, {gaps:.2f} ms of it between ops); the largest: "
            f"{top['n_ops']} ops in {where} ({top['phase']}): {top['ops']}"
        ),
        estimated_gain_pct=gain,
        action=action,
        recipe=FUSED_OPTIMIZER if in_optimizer else None,
    )


__all__ = ["FRAGMENT_OP_SAVING", "FRAGMENT_SHARE_MIN_PCT", "fragmentation"]
