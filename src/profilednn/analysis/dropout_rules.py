"""Advice rule ``dropout_masks``: stock dropout draws its masks one number at a time.

On a CPU, stock dropout (``nn.Dropout``, ``F.dropout``, the attention dropout of
``scaled_dot_product_attention``) draws each mask with ``aten::bernoulli_`` from torch's
global Mersenne-Twister generator, then divides and multiplies in further passes and keeps
the mask for the backward. In nanoGPT's fp32 step on a 2-core Xeon with AMX (4 layers,
n_embd 256, batch 16, block 128, dropout 0.1) ``bernoulli_`` took ~47 ms of ~288 (16%).
``profilednn.kernels.fuse_dropout`` swaps the sites it can reach (``nn.Dropout`` modules
with p > 0, ``nn.MultiheadAttention`` with dropout) for the fused kernel; functional
dropout in user code is not reached, and the evidence says how much of the masks' time
that leaves. Listed in ``rules.RULE_MODULES``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from .rulebook import Advice, denominator, rule, severity_for

if TYPE_CHECKING:
    from .view import RunView

DROPOUT_MIN_PCT = 2.0  # the estimated saving >= 2% of the step
# Share of a stock dropout site's forward+backward time the fused kernel saves: on this
# 2-core Xeon with AMX, fp32, bert_base shapes (benchmarks/bench_dropout.py), FusedDropout
# ran forward+backward 2.38x / 3.48x / 3.42x faster than eager nn.Dropout ([8,128,768]
# 5.18 -> 2.18 ms, [8,128,3072] 20.01 -> 5.75 ms, [8,12,128,128] 10.07 -> 2.95 ms): 0.58-0.71
# of the time saved; 0.6 is the low end, rounded.
FUSED_DROPOUT_SAVING = 0.6
MASK_OP = "aten::bernoulli_"
DROPOUT_OP = "aten::dropout"  # encloses the mask draw and its apply (forward)
DROPOUT_MODULE = "Dropout"  # nn.Dropout: fuse_dropout swaps it (p > 0)
ATTENTION_MODULE = "MultiheadAttention"  # nn.MultiheadAttention: its attention dropout is swapped too
FUSED_MODULES = ("FusedDropout", "FusedDropoutAttention")  # already the fused kernel
SDPA_MATH_OP = "aten::_scaled_dot_product_attention_math"  # SDPA's path with dropout on a CPU


def mask_ops(ops: pl.DataFrame) -> pl.DataFrame:
    """The ``aten::bernoulli_`` rows of an ops table."""
    return ops.filter(pl.col("op") == MASK_OP)


def dropout_modules(ops: pl.DataFrame) -> list[str]:
    """The ``nn.Dropout`` modules that drew a mask (p > 0, in training): the ones
    ``fuse_dropout`` swaps."""
    drawn = mask_ops(ops).filter(pl.col("module_type") == DROPOUT_MODULE)
    return sorted(str(m) for m in drawn["module"].drop_nulls().unique().to_list())


def attention_dropout_ms(ops: pl.DataFrame, n_steps: int) -> tuple[float, int]:
    """Per step, the attention dropout inside ``nn.MultiheadAttention`` modules (each
    module's ``aten::dropout`` time, or its masks' where no ``aten::dropout`` was recorded),
    and how many such modules drew a mask."""
    inside = ops.filter(pl.col("module_type") == ATTENTION_MODULE)
    per_module = inside.group_by("module").agg(
        dropout_ms=pl.col("total_time_ms").filter(pl.col("op") == DROPOUT_OP).sum(),
        mask_ms=pl.col("self_time_ms").filter(pl.col("op") == MASK_OP).sum(),
    ).filter(pl.col("mask_ms") > 0)
    if per_module.height == 0:
        return 0.0, 0
    site = pl.when(pl.col("dropout_ms") > 0).then(pl.col("dropout_ms")).otherwise(pl.col("mask_ms"))
    return float(per_module.select(site.sum()).item()) / n_steps, per_module.height


def sdpa_dropout_ms(ops: pl.DataFrame, n_steps: int) -> tuple[float, list[str]]:
    """Per step, the dropout of ``F.scaled_dot_product_attention`` calls with ``dropout_p``
    (each module that ran SDPA's math path and drew masks there: its ``aten::dropout`` time,
    or its masks'), and those modules: ``profilednn.kernels.scaled_dot_product_attention``
    fuses it."""
    skip = [DROPOUT_MODULE, ATTENTION_MODULE, *FUSED_MODULES]
    rows = ops.filter(~pl.col("module_type").fill_null("").is_in(skip) & pl.col("module").is_not_null())
    per_module = rows.group_by("module").agg(
        sdpa=(pl.col("op") == SDPA_MATH_OP).any(),
        dropout_ms=pl.col("total_time_ms").filter(pl.col("op") == DROPOUT_OP).sum(),
        mask_ms=pl.col("self_time_ms").filter(pl.col("op") == MASK_OP).sum(),
    ).filter(pl.col("sdpa") & (pl.col("mask_ms") > 0))
    if per_module.height == 0:
        return 0.0, []
    site = pl.when(pl.col("dropout_ms") > 0).then(pl.col("dropout_ms")).otherwise(pl.col("mask_ms"))
    return float(per_module.select(site.sum()).item()) / n_steps, sorted(per_module["module"].to_list())


def _where(rows: pl.DataFrame) -> str:
    """``CausalSelfAttention (transformer.h.0.attn, ... 4 modules)``: the module types that
    drew masks outside the swappable sites, largest first."""
    if rows.height == 0:
        return ""
    kinds = (rows.with_columns(pl.col("module_type").fill_null("no module")).group_by("module_type")
             .agg(ms=pl.col("self_time_ms").sum(), modules=pl.col("module").drop_nulls().unique())
             .sort("ms", descending=True))
    parts = []
    for row in kinds.iter_rows(named=True):
        names = sorted(row["modules"])
        listed = f"{names[0]}, ... {len(names)} modules" if len(names) > 2 else ", ".join(names)
        parts.append(f"{row['module_type']} ({listed})" if listed else str(row["module_type"]))
    return ", ".join(parts)


def _sites(n_modules: int, module_ms: float, attentions: int, attention_ms: float, n_sdpa: int,
           sdpa_ms: float) -> list[str]:
    """The swappable dropout sites in words (each with its ms per step when there are several kinds)."""
    sites = [f"{n_modules} nn.Dropout module(s), forward+backward"] if n_modules else []
    parts = [module_ms] if n_modules else []
    if attentions:
        sites.append(f"{attentions} nn.MultiheadAttention attention dropout(s), forward")
        parts.append(attention_ms)
    if n_sdpa:
        sites.append(f"scaled_dot_product_attention's dropout_p in {n_sdpa} module(s), forward")
        parts.append(sdpa_ms)
    if len(sites) > 1:
        sites = [f"{site} {ms:.2f} ms" for site, ms in zip(sites, parts)]
    return sites


def _action(attentions: bool, sdpa: bool) -> str:
    """What to do: fuse_dropout, and what it swaps (the attention and SDPA sites when present)."""
    attention = (" and each nn.MultiheadAttention with dropout (one packed q/k/v projection) by "
                 "FusedDropoutAttention, fused where it is called as plain self-attention without masks"
                 if attentions else "")
    sdpa_text = (" Each F.scaled_dot_product_attention call with dropout_p > 0 becomes "
                 "`profilednn.kernels.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)` (the same "
                 "signature; SDPA's math path with the fused dropout on the probabilities; optimize swaps it "
                 "inside a script)." if sdpa else "")
    return (
        "Draw the masks with the fused kernel: `profilednn.kernels.fuse_dropout(model)` (recipe fused_dropout) "
        "replaces every nn.Dropout with p > 0 by profilednn.kernels.FusedDropout" + attention + "." + sdpa_text
        + " It draws each mask from a counter-based (Philox) generator inside the pass that applies it and "
        "regenerates it for the backward from (seed, offset): nothing is stored. Its masks are not stock's "
        "(another generator, statistically the same dropout); optimize's random-stream gate checks that the model "
        "trains as stock does across dropout seeds."
    )


@rule("dropout_masks")
def dropout_masks(a: "RunView") -> Advice | None:
    """Stock dropout sites that ``profilednn.kernels.fuse_dropout`` swaps (``nn.Dropout``
    modules that drew a mask, ``nn.MultiheadAttention``'s attention dropout) take time a
    fused kernel would mostly save.

    Gain: ``FUSED_DROPOUT_SAVING`` (0.6) of those sites' time per step (the ``nn.Dropout``
    layers forward + backward; the attention's ``aten::dropout``), as a share of the step.
    Fires at ``DROPOUT_MIN_PCT`` (2%) or more. Quiet without layers or ops tables, when no
    swappable site drew a mask, or when the sites are ``FusedDropout`` already. Masks drawn
    elsewhere (functional dropout) are named in the evidence: the swap does not reach them.
    """
    ops, layers = a.ops, a.layers
    denom, of_what = denominator(a)
    if ops is None or layers is None or ops.height == 0 or layers.height == 0 or not denom:
        return None
    n = a.n_steps
    modules = dropout_modules(ops)
    module_rows = layers.filter((pl.col("module_type") == DROPOUT_MODULE) & pl.col("module").is_in(modules)
                                & pl.col("phase").is_in(["forward", "backward"]))
    module_ms = float(module_rows["time_ms"].sum()) / n
    attention_ms, attentions = attention_dropout_ms(ops, n)
    sdpa_ms, sdpa_modules = sdpa_dropout_ms(ops, n)
    swappable_ms = module_ms + attention_ms + sdpa_ms
    if swappable_ms <= 0:
        return None
    gain = FUSED_DROPOUT_SAVING * swappable_ms / denom * 100.0
    if gain < DROPOUT_MIN_PCT:
        return None
    masks = mask_ops(ops)
    at_sites = ((pl.col("module_type") == DROPOUT_MODULE) & pl.col("module").is_in(modules)) | (
        pl.col("module_type") == ATTENTION_MODULE) | pl.col("module").is_in(sdpa_modules)
    site_masks = masks.filter(at_sites)
    fused = pl.col("module_type").is_in(list(FUSED_MODULES)).fill_null(False)
    elsewhere = masks.filter(~at_sites.fill_null(False) & ~fused)
    mask_ms = float(masks["self_time_ms"].sum()) / n
    site_mask_ms = float(site_masks["self_time_ms"].sum()) / n
    other_ms = float(elsewhere["self_time_ms"].sum()) / n
    sites = _sites(len(modules), module_ms, attentions, attention_ms, len(sdpa_modules), sdpa_ms)
    evidence = (
        f"Stock dropout draws its masks with {MASK_OP}: {mask_ms:.2f} ms per step "
        f"({mask_ms / denom * 100.0:.1f}% {of_what}, {float(masks['calls'].sum()) / n:.0f} calls per step). "
        f"The sites the fused kernel reaches take {swappable_ms:.2f} ms per step "
        f"({'; '.join(sites)}), {site_mask_ms:.2f} ms of it drawing masks; fused, an estimated "
        f"{FUSED_DROPOUT_SAVING:.0%} of that is saved ({FUSED_DROPOUT_SAVING * swappable_ms:.2f} ms per step)"
    )
    functional = ""
    if other_ms > 0:
        evidence += (f". {other_ms:.2f} ms per step of {MASK_OP} ({other_ms / denom * 100.0:.1f}% {of_what}) "
                     f"runs outside those sites, in {_where(elsewhere)}: functional dropout (F.dropout), "
                     "which the fused kernel does not reach")
        functional = (
            f" The dropout applied functionally ({other_ms:.2f} ms of masks per step here) stays stock: "
            "an F.dropout(x, p, training) call can be replaced by hand with "
            "`profilednn.kernels.fused_dropout(x, p, training)`."
        )
    action = _action(bool(attentions), bool(sdpa_modules)) + functional
    return Advice(rule="dropout_masks", severity=severity_for(gain), evidence=evidence,
                  estimated_gain_pct=gain, action=action)


__all__ = ["DROPOUT_MIN_PCT", "FUSED_DROPOUT_SAVING", "attention_dropout_ms", "dropout_masks", "dropout_modules",
           "mask_ops", "sdpa_dropout_ms"]
