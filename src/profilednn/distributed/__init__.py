"""Distributed CPU training: plan ranks x threads, launch with torchrun, train, measure, project.

- ``plan``: ranks x threads over sockets/NUMA nodes, core pinning, per-rank thread env.
- ``launch``: pre-flight checks, torchrun (through ``agent``) with a watchdog (its
  parts: ``launch_settings``, ``preflight``, ``prepare``, ``torchrun_args``, ``watchdog``,
  ``job_outcome``);
  ``rank_entry`` pins each rank, runs its Python script and ends it when the script has
  (without PyTorch's native teardown), or execs another command; ``rank_runtime``
  (run_cpu parity: numactl, allocator preload, Intel OpenMP variables) and
  ``rank_output`` (per-rank log files, whole tagged lines on the console).
- ``trainer``: the built-in DDP trainer (checkpoints, resume, per-rank Runs).
- ``merge``: the merged multi-rank view; ``comm``: timed allreduce and alpha-beta fit.
- ``scale`` (Table 3 sweep, weak scaling), ``script_scale`` (the same studies of the
  user's own script; ``script_arms``: ``optimize --nproc-per-node`` of it; over several
  nodes ``node_settings``, ``control`` (node rank 0's control store) and ``follower``
  (``profilednn follow`` on the other nodes)), ``convergence`` (epochs to target vs global
  batch), ``projection`` (1..64 nodes), ``report`` (HTML sections).

Names are loaded on first use, so importing the package costs nothing.
"""

from __future__ import annotations

from .._lazy import lazy_getattr

_LAZY = {
    "LaunchPlan": ".plan", "PlanError": ".plan", "make_plan": ".plan", "rank_env": ".plan",
    "rank_thread_grid": ".plan",
    "backend_status": ".backends", "choose_backend": ".backends",
    "JobFailed": ".launch", "prepare_launch": ".launch", "run_launch": ".launch", "launch": ".launch",
    "check_master": ".launch", "free_port": ".launch", "LaunchSettings": ".launch_settings",
    "RankOutput": ".rank_output", "RuntimeProbe": ".rank_runtime", "probe_runtime": ".rank_runtime",
    "rank_runtime": ".rank_runtime",
    "TrainConfig": ".config", "TrainResult": ".trainer", "train": ".trainer",
    "init_distributed": ".trainer",
    "MergedView": ".merge", "merge_job": ".merge", "merge_rank_steps": ".merge", "rank_runs": ".merge",
    "AlphaBeta": ".comm", "fit_alpha_beta": ".comm", "measure_allreduce": ".comm",
    "ScaleResult": ".scale", "scale_sweep": ".scale", "weak_scaling": ".scale",
    "scale_script": ".script_scale", "weak_script": ".script_scale",
    "optimize_ddp_script": ".script_arms", "apply_launched": ".script_arms",
    "Nodes": ".node_settings", "follow": ".follower", "ControlHost": ".control", "hosting": ".control",
    "ConvergenceResult": ".convergence", "convergence_study": ".convergence",
    "project_nodes": ".projection", "NodeProjection": ".projection",
    "save_checkpoint": ".checkpoint", "load_checkpoint": ".checkpoint", "latest_checkpoint": ".checkpoint",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = sorted(_LAZY)
