"""The reference arm of ``optimize``: what every recipe is judged against.

The stock setup's seeded loss trajectory and gradients, its drift under rounding-level
weight noise (the numerics tolerance's calibration), and, for recipes that change the
number format, the precision gate's noise floor at that precision (measured on first use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ProfileDNNError
from ..progress import Progress
from ..train_step import TrainStep
from .numerics import NumericsResult, Trajectory, record_trajectory, rounding_noise
from .precision_gate import Calibration, calibrate
from .settings import Settings



class GateCalibrations:
    """The precision gate's calibration per precision, measured once, when first asked."""

    def __init__(self, base: TrainStep, settings: Settings, say: Progress) -> None:
        self.base, self.settings, self.say = base, settings, say
        self.done: dict[str, Calibration] = {}

    def __call__(self, precision: str) -> Calibration:
        if precision not in self.done:
            self.say(f"stock over {self.settings.gate().steps} steps, and with weights perturbed at {precision} "
                     "resolution (the precision gate's noise floor)")
            self.done[precision] = calibrate(self.base, precision, self.settings.gate())
        return self.done[precision]


@dataclass
class Reference:
    """The stock setup's trajectory, its rounding-level noise (None when not calibrated)
    and the precision gate's calibrations."""

    trajectory: Trajectory
    noise: NumericsResult | None
    calibration: GateCalibrations


def take_reference(base: TrainStep, settings: Settings, say: Progress) -> Reference:
    """Run the stock setup (a clone of ``base``) for the numerics reference."""
    say(f"stock: {settings.numerics_steps} seeded steps (the numerics reference)")
    reference = record_trajectory(base.clone(), settings.numerics_steps, settings.seed)
    if not all(math.isfinite(x) for x in reference.losses):
        raise ProfileDNNError(f"the stock setup's loss is not finite ({reference.losses}): nothing to compare against")
    noise = None
    if settings.calibrate_noise:
        say("stock again with rounding-level weight noise (calibrates the numerics tolerance)")
        noise = rounding_noise(base.clone(), reference, settings.numerics_steps, settings.seed)
    return Reference(reference, noise, GateCalibrations(base, settings, say))


__all__ = ["GateCalibrations", "Reference", "take_reference"]
