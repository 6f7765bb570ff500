"""``ddp_bucket_size``: ``DistributedDataParallel(model, ..., bucket_cap_mb=C)``, C from the
model's gradient bytes: one allreduce a step where the gradients fit 256 MB.

DDP reduces its gradients bucket by bucket, one collective each: after its first iteration
a 1 MB first bucket (the last layers' gradients, so that a collective starts early), then
buckets of 25 MB. That split pays where the collectives run beside the backward on a
device of their own. On a CPU with gloo they share the cores the backward computes on, so
overlapping them buys little, while each collective has a fixed cost: a ring allreduce is
2 (N - 1) messages between N ranks, each a round trip through the kernel's sockets and a
wake-up of gloo's thread, tens of microseconds on one machine and more between machines.
Fewer collectives is what helps, so C puts all the gradients in one bucket: the gradient
MB rounded up, plus 1 for rounding (a bucket closes at the parameter that reaches it),
never below DDP's 25 (passing any value also makes the first bucket that size, so a model
with 1-25 MB of gradients goes from two collectives to one), and at most 256: a 256 MB
allreduce moves its bytes for tens of milliseconds, against which the fixed cost is
below 1 %, while one bucket for a larger model would leave no collective to overlap at
all. Not tried where the gradients fit DDP's 1 MB first bucket (already one collective).

The buckets hold the same values, but with more than two ranks gloo's ring splits a bucket
into chunks by its size, and an element's sum is added up in another order: judged by the
arithmetic gate (losses within rounding noise).
"""

from __future__ import annotations

import math

from .ddp_recipe import DdpArgumentRecipe
from .script_facts import DdpFacts

MB = 2**20
DEFAULT_CAP_MB = 25  # DDP's bucket_cap_mb
FIRST_BUCKET_MB = 1  # DDP's first bucket, when the script passes no bucket_cap_mb
CEILING_MB = 256


def bucket_cap_mb(gradient_bytes: int) -> int:
    """The bucket cap that puts ``gradient_bytes`` of gradients in one bucket (see the module
    doc): at least DDP's 25 MB, at most 256 MB."""
    return max(DEFAULT_CAP_MB, min(math.ceil(gradient_bytes / MB) + 1, CEILING_MB))


def default_collectives(gradient_bytes: int) -> int:
    """About how many collectives DDP's default buckets make a step: a 1 MB one, then 25 MB ones."""
    rest = max(0.0, gradient_bytes / MB - FIRST_BUCKET_MB)
    return 1 + math.ceil(rest / DEFAULT_CAP_MB)


class DdpBucketSize(DdpArgumentRecipe):
    name = "ddp_bucket_size"
    summary = "larger DDP gradient buckets: one allreduce a step, not a 1 MB bucket then 25 MB ones"
    argument = "bucket_cap_mb"
    multi_rank = True

    def value(self, model: DdpFacts) -> int:
        return bucket_cap_mb(model.gradient_bytes)

    def describe(self, value: int, model: DdpFacts) -> str:
        collectives = math.ceil(model.gradient_bytes / MB / value) or 1
        return (f"DistributedDataParallel({self.argument}={value}) for {model.module_type}: "
                f"{model.gradient_bytes / MB:.1f} MB of gradients in {collectives} allreduce(s) a step (DDP's "
                f"default buckets: about {default_collectives(model.gradient_bytes)})")

    def why_not(self, candidates: list[DdpFacts]) -> str | None:
        largest = max(m.gradient_bytes for m in candidates)
        if largest > FIRST_BUCKET_MB * MB:
            return None
        return f"the gradients ({largest / MB:.2f} MB) already travel in one bucket: one allreduce a step"


RECIPE = DdpBucketSize()
