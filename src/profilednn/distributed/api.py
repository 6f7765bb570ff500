"""The distributed job's Python API: what ``profilednn launch`` / ``plan`` / ``train`` /
``ranks`` / ``scale`` / ``convergence`` / ``project-nodes`` call, and what ``profilednn``
exports. Names load on first use: launching imports no torch, training does."""

from __future__ import annotations

from .._lazy import lazy_getattr

_WHERE = {  # module: the names it contributes
    ".plan": ("make_plan",), ".launch": ("clean_exit_note", "launch", "prepare_launch", "run_launch"),
    ".launch_settings": ("LaunchSettings",),
    ".rank_output": ("parse_ranks",), ".config": ("TrainConfig",), ".trainer": ("train", "resolve_batches"),
    ".merge": ("merge_job",), ".scale": ("ScaleResult", "scale_sweep", "weak_scaling"),
    ".script_scale": ("scale_script", "weak_script"), ".script_arms": ("apply_launched", "optimize_ddp_script"),
    ".node_settings": ("Nodes", "nodes_of"), ".follower": ("follow",), ".convergence": ("convergence_study",),
    ".comm": ("AlphaBeta",), ".projection": ("project_nodes",),
}
_API = {name: module for module, names in _WHERE.items() for name in names}
__getattr__ = lazy_getattr("profilednn.distributed", _API)

__all__ = sorted(_API)
