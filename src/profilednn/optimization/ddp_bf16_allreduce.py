"""``ddp_bf16_allreduce``: the gradients reduced in BF16, PyTorch's ``bf16_compress_hook``
registered on the script's ``DistributedDataParallel``.

The hook casts each bucket to BF16, divides it by the ranks, allreduces it and casts the
sum back: half the bytes through gloo's sockets and its reduction loops, for a rounding of
every gradient to 8 bits of mantissa. The cast is cheap on any x86 CPU (no native BF16
arithmetic is needed), so it is tried on every CPU and judged by the precision gate (does
it train as the stock job does?). Registered at the model's first call, so a hook the
script registers after building the model stands (and one seen by the stock arm rules the
recipe out).

DDP refuses ``bf16_compress_hook`` by name unless torch was built with CUDA and NCCL
(``_check_comm_hook``), though gloo reduces BF16 on a CPU-only build: the hook is called
through a function of another name, and the code edit says the same.

The precision gate's digits task (when the loss trajectory is not conclusive) trains the
digits MLP data-parallel in one process (``ddp_shards.ShardedStep``): each batch split over
the job's ranks (at least 2), the shards' gradients reduced as ``bf16_compress_hook`` does
(``bf16_compressed_average``) against DDP's fp32 average, same seed and batches.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import torch

from .ddp_recipe import DdpRecipe, no_ddp, one_rank
from .ddp_shards import ShardedStep, fp32_average
from .injection import Injection, ScriptProcess
from .recipe_contract import BF16_TOLERANCE, Context, DigitsArms
from .script_facts import DdpFacts, ScriptFacts


def bf16_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
    """``bf16_compress_hook`` under a name DDP's CUDA/NCCL check does not refuse. Not
    annotated: DDP rejects a hook whose annotations are not ``dist.GradBucket`` and
    ``Future[Tensor]`` themselves, and this module's are strings."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    return bf16_compress_hook(process_group, bucket)


def bf16_compressed_average(grads: list[torch.Tensor]) -> torch.Tensor:
    """What ``bf16_compress_hook`` leaves in every rank's gradient, from the ranks' gradients
    (rank order): each cast to BF16 and divided by the ranks in BF16, the allreduce's sum in
    BF16 (gloo adds two BF16 values and rounds the sum to BF16; rank after rank here, which
    is gloo's order for 2 ranks and within BF16 rounding of it for more), cast back."""
    total = grads[0].to(torch.bfloat16).div_(len(grads))
    for g in grads[1:]:
        total = total + g.to(torch.bfloat16).div_(len(grads))
    return total.to(grads[0].dtype)


class DdpBf16Allreduce(DdpRecipe):
    name = "ddp_bf16_allreduce"
    summary = "DDP gradients allreduced in BF16 (bf16_compress_hook): half the bytes through gloo"
    tolerance = BF16_TOLERANCE
    precision = "bf16"
    reduction = staticmethod(bf16_compressed_average)  # what the hook does to the ranks' gradients

    def digits_arms(self, ctx: Context, ranks: int) -> DigitsArms:
        """The digits trained data-parallel over the job's ranks (at least 2), in one process:
        DDP's fp32 average (stock) against the hook's BF16 reduction."""
        ranks = max(2, ranks)
        return DigitsArms(ShardedStep(ranks, fp32_average), ShardedStep(ranks, self.reduction),
                          f"each batch split over {ranks} simulated ranks, their gradients averaged in fp32 "
                          "(stock) or reduced as bf16_compress_hook does (the recipe)")

    def script_check(self, facts: ScriptFacts, ctx: Context, accepted: Collection[str] = ()) -> str | None:
        reason = no_ddp(facts) or one_rank(facts)
        if reason:
            return reason
        if all(m.comm_hook for m in facts.ddp):
            hooks = ", ".join(dict.fromkeys(str(m.comm_hook) for m in facts.ddp))
            return f"the script registers a comm hook of its own ({hooks})"
        return None

    def code_edit(self, facts: ScriptFacts) -> str | None:
        return ("model.register_comm_hook(None, lambda group, bucket: bf16_compress_hook(group, bucket)) "
                "(bf16_compress_hook from torch.distributed.algorithms.ddp_comm_hooks.default_hooks; the lambda "
                "because a torch built without CUDA refuses the hook by its name)")

    def injection(self) -> Injection:
        return RegisterBf16Hook()


class RegisterBf16Hook(Injection):
    """Each DDP model the script builds gets the BF16 hook at its first call, unless the
    script registered a hook of its own by then."""

    def ddp_created(self, process: ScriptProcess, model: Any, facts: DdpFacts) -> None:
        def first_call(module: Any, args: Any) -> None:
            handle.remove()
            if facts.comm_hook is not None:  # the script's own hook stands
                return
            with process.unobserved():
                module.register_comm_hook(None, bf16_allreduce_hook)
            process.said(RECIPE.name, f"{facts.module_type}'s gradients allreduced in BF16 (bf16_compress_hook) "
                                      f"over {facts.world_size} ranks")

        handle = model.register_forward_pre_hook(first_call)


RECIPE = DdpBf16Allreduce()
