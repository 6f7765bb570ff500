"""``Settings``: how hard ``optimize`` measures; each field's default and help, said once.

One type for both arm kinds: a built-in setup (arms in this process) and a user's script
(every arm a child process). Where a script's default differs, the field says so
(``option(..., script=...)``) and :meth:`Settings.for_script` takes it.
``profilednn optimize`` builds its options from these fields (``cli/field_options.py``),
so this module imports no PyTorch: the CLI reads it while it starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import InputError, ProfileDNNError
from ..option_fields import option, script_defaults

if TYPE_CHECKING:
    from .precision_gate import GateSettings


@dataclass
class Settings:
    """How hard ``optimize`` measures (each field's help says what it does).

    With ``calibrate_noise`` the stock setup is run once more with its weights perturbed at
    fp32 rounding level, and each recipe may drift up to ``noise_factor`` times that (or its
    stated tolerance, if larger). With ``headroom`` the optimized setup is profiled for
    ``headroom_steps`` steps at the end and split by op family (``headroom.py``).
    """

    numerics_steps: int = option(3, help="Seeded steps in each numerics check.")
    rounds: int = option(12, script=6, help="Most paired rounds an A/B may run (a script: child processes per arm); "
                                            "it stops as soon as the speedup's interval decides.")
    warmup: int = option(1, script=2, help="Untimed steps per arm before the timed ones (a script's 2 let the "
                                           "injected torch.compile compile before the timed steps).")
    min_speedup: float = option(1.02, help="Speedup a recipe needs to be kept: its interval's lower bound must "
                                           "clear it (rejected when the upper bound is below it).")
    time_budget_s: float | None = option(900.0, flags=("--time-budget",),
                                         help="Seconds the search plans its A/Bs in (each gets an even share of "
                                              "what is left; every A/B still runs 2 rounds); 0: no limit but "
                                              "--rounds.")
    noise_rounds: int = option(3, script=0, help="A-vs-A rounds of the stock setup against itself before the first "
                                                 "A/B (this machine's noise for the workload; a script: its arms' "
                                                 "repeated runs measure it).")
    seed: int = option(0, help="Seed for weights, synthetic data and the numerics check.")
    child_runs: int = option(4, help="Most rounds (one child process per arm each) of a process-level recipe's A/B.")
    child_steps: int = option(3, script=5, flags=("--steps",),
                              help="Timed steps per child process (a script: its window is --warmup + --steps).")
    env_warmup: int = option(6, help="Untimed steps before the timed ones in each child process that times a launch "
                                     "setting (allocator, threads) or the total (a model: its numerics steps "
                                     "included; a script: at least --warmup): huge pages and an allocator's caches "
                                     "settle over the first steps.")
    child_timeout_s: float = option(3600.0, help="Seconds a child process may run.")
    noise_factor: float = option(5.0, help="Drift a recipe may show, in multiples of the rounding-level noise.")
    calibrate_noise: bool = option(True, help="Measure the stock setup's rounding-level noise first.")
    final_ab: bool = option(True, help="Time stock against optimized once more at the end (the total).")
    measure_flops: bool = option(True, help="Count model FLOPs per step against the machine's GEMM peaks.")
    options: dict[str, Any] = option(default_factory=dict, help="Recipe options (compile_mode).")
    precision_steps: int = option(8, help="Steps of the precision gate's trajectories.")
    digits_epochs: int = option(6, help="Epochs of the precision gate's digits task.")
    digits_target: float = option(0.90, help="Accuracy the precision gate's digits task must reach.")
    headroom: bool = option(True, flags=("--headroom/--no-headroom",),
                            help="Profile a few steps of the optimized setup at the end and split them by op family.")
    headroom_steps: int = option(3, help="Steps profiled for the headroom split.")
    threads: int | None = option(None, help="torch's intra-op threads in every arm, set before the search "
                                            "(None: the process's own; a script: its own choice).")
    nproc_per_node: int = option(1, flags=("--nproc-per-node",),
                                 help="A data-parallel script's ranks: every arm is a pinned launch of the script "
                                      "on this many ranks (gloo), its step the slowest rank's, --threads per rank "
                                      "(default: cores / ranks); 1: one process.")
    nnodes: int = option(1, flags=("--nnodes",),
                         help="A data-parallel script's nodes: every arm is launched on each node, optimize on node "
                              "rank 0 (--master-addr, --master-port) and `profilednn follow` on each other node "
                              "(docs/distributed.md); --nproc-per-node ranks on each.")
    batch_arg: str | None = option(None, flags=("--batch-arg",),
                                   help="With --nproc-per-node: the script's per-rank batch option (e.g. "
                                        "--batch-arg=--batch-size); the other ranks x threads layouts of the same "
                                        "cores are then tried at the end, each rank's batch set to keep the "
                                        "script's global batch.")

    @classmethod
    def for_script(cls, **given: Any) -> "Settings":
        """Settings for ``optimize -- python train.py``: the script defaults where a field
        has one, ``given`` over them."""
        return cls(**{**script_defaults(cls), **given})

    @property
    def budget_s(self) -> float | None:
        """The time budget in seconds, None for none (``--time-budget 0``)."""
        return self.time_budget_s or None

    @property
    def launched(self) -> bool:
        """Whether every arm is a launch of several ranks (``--nproc-per-node`` or ``--nnodes`` above 1)."""
        return self.nproc_per_node > 1 or self.nnodes > 1

    @property
    def window(self) -> int:
        """The steps a script's arm trains: ``warmup`` untimed, then ``child_steps`` timed."""
        return self.warmup + self.child_steps

    def gate(self, steps: int | None = None) -> GateSettings:
        """The precision gate's settings (recipes that change the number format), over
        ``steps`` (default: the longer of the precision and numerics steps; a script's arms
        judge their whole window)."""
        from .precision_gate import GateSettings

        return GateSettings(steps=steps or max(self.precision_steps, self.numerics_steps), factor=self.noise_factor,
                            digits_epochs=self.digits_epochs, digits_target=self.digits_target, seed=self.seed,
                            ranks=self.nproc_per_node * self.nnodes)

    def check(self) -> None:
        """Raise ``ProfileDNNError`` naming the first setting out of range."""
        if not self.noise_factor > 0:
            raise ProfileDNNError(f"noise_factor must be > 0, got {self.noise_factor}")
        if self.numerics_steps < 1 or self.rounds < 1 or self.warmup < 0:
            raise ProfileDNNError("numerics_steps and rounds must be >= 1, warmup >= 0")
        if self.child_runs < 1 or self.child_steps < 1 or self.env_warmup < 0:
            raise ProfileDNNError("child_runs and child_steps must be >= 1, env_warmup >= 0")
        if not self.min_speedup > 0:
            raise ProfileDNNError(f"min_speedup must be > 0, got {self.min_speedup}")
        if self.headroom_steps < 1:
            raise ProfileDNNError(f"headroom_steps must be >= 1, got {self.headroom_steps}")
        if self.precision_steps < 2 or self.digits_epochs < 1 or not 0.0 < self.digits_target <= 1.0:
            raise ProfileDNNError("precision_steps must be >= 2, digits_epochs >= 1, digits_target in (0, 1]")
        if self.time_budget_s is not None and self.time_budget_s < 0:
            raise ProfileDNNError(f"--time-budget must be >= 0 seconds, got {self.time_budget_s}")
        if self.noise_rounds < 0:
            raise ProfileDNNError(f"--noise-rounds must be >= 0, got {self.noise_rounds}")
        if self.threads is not None and self.threads < 1:
            raise ProfileDNNError(f"threads must be >= 1, got {self.threads}")
        if self.nproc_per_node < 1:
            raise InputError(f"--nproc-per-node must be >= 1, got {self.nproc_per_node}")
        if self.nnodes < 1:
            raise InputError(f"--nnodes must be >= 1, got {self.nnodes}")
        if self.batch_arg is not None and (not self.launched or not self.batch_arg.startswith("-")):
            raise InputError(f"--batch-arg takes the script's per-rank batch option (e.g. --batch-arg=--batch-size) "
                             f"with --nproc-per-node 2 or more, not {self.batch_arg!r} with {self.nproc_per_node}")

    def check_script(self) -> None:
        """:meth:`check`, and what a script's arm needs besides: a warm-up step (its first step
        also runs the script's set-up)."""
        self.check()
        if self.warmup < 1:
            raise InputError(f"--warmup must be >= 1 for a script (its first step also runs the script's set-up), "
                             f"got {self.warmup}")


__all__ = ["Settings"]
