"""``ddp_bucket_view``: ``DistributedDataParallel(model, ..., gradient_as_bucket_view=True)``.

By default DDP keeps every gradient twice: the parameter's ``.grad`` and its slice of the
flat bucket the allreduce reduces, copied into the bucket before the allreduce and back
after it. With bucket views each ``.grad`` is a view into its bucket: no copies either way,
and the gradients' memory once instead of twice. The sums are the same, into the same
buffers: judged by the environment gate (the same losses as the arm).
"""

from __future__ import annotations

from .ddp_recipe import DdpArgumentRecipe


class DdpBucketView(DdpArgumentRecipe):
    name = "ddp_bucket_view"
    summary = "DDP gradients as views into its allreduce buckets: no copy into them and back"
    changes_arithmetic = False
    argument = "gradient_as_bucket_view"


RECIPE = DdpBucketView()
