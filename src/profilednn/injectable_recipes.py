"""The recipes ``profilednn optimize -- python train.py ...`` can inject into a user's
script, importable without torch.

``optimization/script/inject.py`` acts on exactly these (it imports this tuple); the
analysis reads it too, so an advice item about a script Run sends the user to
``optimize -- ...`` only for a recipe that can reach the script, and to a hand edit for
one that cannot. The analysis ranks below ``optimization`` and may not import it.
"""

from __future__ import annotations

# What an arm can inject, in the order the recipes act on a root module.
INJECTABLE: tuple[str, ...] = ("frozen_weight_grads", "fused_loss", "fused_optimizer", "channels_last",
                               "dtype_policy", "fused_batchnorm", "pointwise_gemm", "fused_dropout",
                               "torch_compile", "dataloader_workers")

__all__ = ["INJECTABLE"]
