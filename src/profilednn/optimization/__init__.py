"""The optimize job: recipes applied one by one and each proven by measurement.

    import profilednn
    model, optimizer, loss_fn, report = profilednn.optimize(model, optimizer, loss_fn, (x, y))
    print(report.table())

Every recipe says when it applies, applies itself to a fresh copy of the setup, and is
kept only when an interleaved A/B of step time shows it faster and a seeded numerics
check shows it trains the same (``engine.py``). Recipes: ``frozen_weight_grads``,
``frozen_batchnorm``, ``fused_loss``, ``fused_optimizer``, ``channels_last``,
``dtype_policy``, ``torch_compile``, ``dataloader_workers``, the DistributedDataParallel
recipes of a script (``ddp_bucket_view``, ``ddp_static_graph``, ``ddp_bucket_size``,
``ddp_bf16_allreduce``), ``threads``, ``allocator``.

The package is named ``optimization`` (as ``projection`` is the ``project`` job's) so that
``profilednn.optimize`` stays the function; ``api.py`` lists the public names.
"""

from __future__ import annotations

from .._lazy import lazy_getattr
from .api import __all__

# the job's public names (api.py lists them), loaded on first use: importing the package
# (the CLI reads ``optimization.settings`` while it starts) loads no PyTorch
__getattr__ = lazy_getattr(__name__, {name: "profilednn.optimization.api" for name in __all__})
