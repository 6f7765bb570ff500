"""Capture overhead on public scripts no one here wrote, each run unmodified.

Three scripts (``--script``, default ``chargpt``; ``all`` runs each in turn):

- ``chargpt``: karpathy/minGPT's ``projects/chargpt/chargpt.py`` (gpt-mini, 2.7M parameters,
  dropout; at iteration 0, inside the warm-up, it samples 500 tokens under ``torch.no_grad()``
  and saves a checkpoint; two forked DataLoader workers). Give the checkout's folder.
- ``imagenet``: pytorch/examples' ``imagenet/main.py`` (give the file, ``--imagenet-main``)
  with ``--dummy`` (torchvision's FakeData, 224x224), ``--arch`` (resnet18), ``-j`` DataLoader
  workers, ``--no-accel`` (CPU). Its validation runs after an epoch, never within the steps.
- ``hf_trainer``: huggingface/transformers' ``examples/pytorch/image-pretraining/run_mae.py``
  (give the file, ``--run-mae``): a ``Trainer`` pre-training a ViTMAE shrunk by
  ``--config_overrides`` (about 2.4M parameters), ``--eval_strategy steps --eval_steps 2``,
  so an evaluation (``no_grad`` forwards) runs after the last warm-up step and inside the
  window. Needs ``pip install datasets`` (5.2 with transformers 5.23); runs offline: its
  images are seeded PNGs written at start, nothing is downloaded (``scripts/script_presets.py``).

Four modes, each a fresh process, interleaved round by round: ``plain`` (the script alone,
stopped after the same iterations), ``profiler`` (``torch.profiler`` alone over the measured
steps, with full capture's options), ``light`` and ``full`` (``profilednn profile [--light]
--stop-after --steps S --warmup W -- python scripts/script_timed.py ...``). A step is the
interval between two consecutive ``optimizer.step()`` calls inside the measured window
(``scripts/script_timed.py``, the launcher all modes share); peak RSS is the main process's
(``wait4``); wall is the whole process, start-up included. Besides the pooled medians, each
round's median step of a mode is divided by the same round's plain median: the median of
those paired ratios over rounds and their range say whether a mode is within a target
(light within 3%) better than pooled medians on a noisy machine.

Top layers: for each light and full Run, its ``--top`` heaviest leaf layers as its layer table
ranks them (a full Run by its light reference's times when it has one, ``profile``'s own
table) and, for a full Run, as its own full-capture times would rank them; the last lines say
how many of light's top layers each full ranking shares, the same by role (a layer's place in
a repeated block, ``transformer.h.*.mlp.act``: identical blocks tie layer by layer, so which
copy tops a table is noise), and the full capture's inflation note (with the layers' page
faults under torch.profiler against the light reference).

    python benchmarks/bench_capture.py --script /work/ext/minGPT            # via bench_capture.py
    python benchmarks/bench_capture_script.py /work/ext/minGPT --rounds 2 --batch-size 16
    python benchmarks/bench_capture_script.py --script imagenet --imagenet-main EXAMPLES/imagenet/main.py
    python benchmarks/bench_capture_script.py --script hf_trainer \\
        --run-mae TRANSFORMERS/examples/pytorch/image-pretraining/run_mae.py
    python benchmarks/bench_capture_script.py MINGPT --script all --imagenet-main ... --run-mae ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
LAUNCHER = HERE / "scripts" / "script_timed.py"
MODES = ("plain", "profiler", "light", "full")
MAE_CONFIG = ("hidden_size=192,num_hidden_layers=4,num_attention_heads=3,intermediate_size=768,"
              "decoder_hidden_size=128,decoder_num_hidden_layers=2,decoder_num_attention_heads=2,"
              "decoder_intermediate_size=512")


@dataclass(frozen=True)
class Script:
    """One public script: where it is, its launcher preset, its arguments for ``n`` iterations."""

    name: str
    path: Callable[[argparse.Namespace], str | None]
    args: Callable[[argparse.Namespace, int], list[str]]
    title: Callable[[argparse.Namespace], str]
    batch: int
    workers: int
    stops_itself: bool = False  # its own iteration limit ends the plain run (no --stop-at)


def _chargpt_path(a: argparse.Namespace) -> str | None:
    return str(Path(a.mingpt) / "projects" / "chargpt" / "chargpt.py") if a.mingpt else None


def _mae_args(a: argparse.Namespace, n: int) -> list[str]:
    return ["--config_overrides", MAE_CONFIG, "--do_train", "--do_eval", "--eval_strategy", "steps",
            "--eval_steps", "2", "--logging_steps", "1", "--save_strategy", "no", "--report_to", "none",
            "--use_cpu", "--remove_unused_columns", "False", "--label_names", "pixel_values",
            "--per_device_train_batch_size", str(a.batch_size), "--per_device_eval_batch_size",
            str(a.batch_size), "--dataloader_num_workers", str(a.workers), "--seed", "0",
            "--max_steps", str(a.warmup + a.steps + 1)]  # one schedule for every mode


SCRIPTS = {s.name: s for s in (
    Script("chargpt", _chargpt_path,
           lambda a, n: [f"--trainer.max_iters={n}", f"--trainer.batch_size={a.batch_size}",
                         f"--trainer.num_workers={a.workers}"],
           lambda a: f"chargpt (minGPT gpt-mini), batch {a.batch_size}, {a.workers} DataLoader workers",
           batch=16, workers=2, stops_itself=True),
    Script("imagenet", lambda a: a.imagenet_main,
           lambda a, n: ["--dummy", "--no-accel", "-a", a.arch, "-j", str(a.workers),
                         "-b", str(a.batch_size), "--seed", "0"],
           lambda a: f"imagenet example ({a.arch}, --dummy 224x224), batch {a.batch_size}, "
                     f"{a.workers} DataLoader workers",
           batch=8, workers=2),
    Script("hf_trainer", lambda a: a.run_mae, _mae_args,
           lambda a: f"run_mae.py (HF Trainer, ViTMAE shrunk, eval every 2 steps), batch {a.batch_size}, "
                     f"{a.workers} DataLoader workers",
           batch=8, workers=0),
)}


def _command(script: Script, mode: str, times: Path, runs: Path, a: argparse.Namespace) -> list[str]:
    w, s = a.warmup, a.steps
    n = w + s if mode == "plain" else w + s + 1
    launch = [str(LAUNCHER), "--preset", script.name, "--times", str(times)]
    if mode == "profiler":
        launch += ["--profiler-window", f"{w}:{w + s}"]
    if not script.stops_itself:
        launch += ["--stop-at", str(n)]  # plain: the window's end; otherwise a safety net
    launch += [script.path(a), "--", *script.args(a, n)]  # type: ignore[list-item]
    if mode in ("plain", "profiler"):
        return [sys.executable, *launch]
    light = ["--light"] if mode == "light" else []
    return [sys.executable, "-m", "profilednn", "profile", *light, "--stop-after", "--steps", str(s),
            "--warmup", str(w), "-o", str(runs), "--", "python", *launch]


def run_once(script: Script, mode: str, work: Path, a: argparse.Namespace) -> dict[str, object]:
    """One process of ``mode``: its window's step times (ms), peak RSS (MiB) and wall (s)."""
    times = work / f"{script.name}-{mode}-{time.monotonic_ns()}.json"
    log_path = work / f"{script.name}-{mode}.log"
    cmd = _command(script, mode, times, work / "runs", a)
    t0 = time.perf_counter()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
        raise SystemExit(f"{script.name} {mode} exited {code}: {' '.join(cmd)}\n{tail}")
    starts = json.loads(times.read_text())["step_starts_s"]
    w, s = a.warmup, a.steps
    # intervals between step starts that lie wholly inside the window (steps w .. w+s-1)
    steps = [(b - t) * 1000 for t, b in zip(starts[w:w + s - 1], starts[w + 1:w + s])]
    out: dict[str, object] = {"steps": steps, "rss_mib": usage.ru_maxrss / 1024, "wall_s": wall}
    if mode in ("light", "full"):
        out.update(top_layers(newest_run(work / "runs"), a.top))
    return out


def newest_run(runs: Path) -> Path:
    """The Run folder the last ``profile`` wrote under ``runs``."""
    return max((p for p in runs.iterdir() if (p / "manifest.json").is_file()), key=lambda p: p.stat().st_mtime)


def top_layers(run_path: Path, k: int) -> dict[str, object]:
    """A Run's ``k`` heaviest leaf layers as its table ranks them (``top``), by its own times
    (``top_own``) and its inflation note (a full Run with a light reference)."""
    from profilednn import load_run
    from profilednn.step_summary import fwd_bwd_by_layer, layer_inflation, ranked_by_light, step_stats
    from profilednn.tables import LAYER_REFERENCE

    run = load_run(run_path)
    own = fwd_bwd_by_layer(run.layers, run.steps.height)
    ranked = own
    if run.has_table(LAYER_REFERENCE):
        ranked = ranked_by_light(own, layer_inflation(run.layers, run.table(LAYER_REFERENCE),
                                                      step_stats(run.steps)["median_ms"]))
    notes = [n for n in run.manifest.get("notes") or [] if "light reference" in n]
    light = ranked["light_ms"] if "light_ms" in ranked.columns else ranked["total_ms"]
    return {"top": ranked["module"].head(k).to_list(), "top_own": own["module"].head(k).to_list(),
            "roles": top_roles(ranked["module"].to_list(), light.fill_null(0.0).to_list(), k),
            "roles_own": top_roles(own["module"].to_list(), own["total_ms"].to_list(), k),
            "note": notes[0] if notes else None}


def role(module: str) -> str:
    """A layer's place in a repeated block: ``transformer.h.3.mlp.act`` -> ``transformer.h.*.mlp.act``."""
    return ".".join("*" if part.isdigit() else part for part in module.split("."))


def top_roles(modules: list[str], ms: list[float], k: int) -> list[str]:
    """The ``k`` heaviest roles, each the sum of its layers' ms: the six identical blocks of a
    GPT tie layer by layer, so which copy tops a table is noise; the role is the finding."""
    total: dict[str, float] = {}
    for m, t in zip(modules, ms):
        total[role(m)] = total.get(role(m), 0.0) + t
    return sorted(total, key=lambda r: -total[r])[:k]


def bench_script(script: Script, a: argparse.Namespace) -> None:
    """Interleaved rounds of every mode on one script, then its table."""
    a.batch_size = a.batch if a.batch is not None else script.batch
    a.workers = a.num_workers if a.num_workers is not None else script.workers
    results: dict[str, list[dict[str, object]]] = {m: [] for m in a.modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for mode in a.modes:
                results[mode].append(run_once(script, mode, Path(tmp), a))
                last = results[mode][-1]
                print(f"  {script.name} round {r + 1} {mode:8} steps {[round(t) for t in last['steps']]} ms, "
                      f"RSS {last['rss_mib']:.0f} MiB, wall {last['wall_s']:.1f} s", flush=True)
    report(script, results, a)
    if "light" in results and "full" in results:
        report_layers(results, a.top)


def report_layers(results: dict[str, list[dict[str, object]]], k: int) -> None:
    """Per round, the top layers of light and full and how many of light's each full ranking shares."""
    print(f"\ntop {k} layers, per round (light | full as its table ranks them | full by its own times)")
    for r, (light, full) in enumerate(zip(results["light"], results["full"]), 1):
        ref = set(light["top"])  # type: ignore[arg-type]
        shared = len(ref & set(full["top"]))  # type: ignore[arg-type]
        shared_own = len(ref & set(full["top_own"]))  # type: ignore[arg-type]
        print(f"  round {r}: light {light['top']}\n           full  {full['top']} ({shared}/{k} shared)\n"
              f"           own   {full['top_own']} ({shared_own}/{k} shared)")
        roles = set(light["roles"])  # type: ignore[arg-type]
        print(f"   by role: light {light['roles']}\n           full  {full['roles']} "
              f"({len(roles & set(full['roles']))}/{k} shared, same order: {light['roles'] == full['roles']})\n"  # type: ignore[arg-type]
              f"           own   {full['roles_own']} ({len(roles & set(full['roles_own']))}/{k} shared)")  # type: ignore[arg-type]
        if full["note"]:
            print(f"           note: {full['note']}")


def paired_ratios(results: dict[str, list[dict[str, object]]], mode: str) -> list[float]:
    """Per round, ``mode``'s median step over the same round's plain median step."""
    return [statistics.median(r["steps"]) / statistics.median(p["steps"])  # type: ignore[arg-type]
            for r, p in zip(results[mode], results["plain"])]


def report(script: Script, results: dict[str, list[dict[str, object]]], a: argparse.Namespace) -> None:
    steps = {m: [t for r in rs for t in r["steps"]] for m, rs in results.items()}  # type: ignore[union-attr]
    med = {m: statistics.median(v) for m, v in steps.items()}
    print(f"\n{script.title(a)}, --warmup {a.warmup} --steps {a.steps}, {a.rounds} rounds")
    print(f"{'mode':9} {'step ms':>9} {'min':>8} {'max':>8} {'vs plain':>9} {'peak RSS MiB':>13} {'wall s':>8}")
    for m in results:
        rss = max(r["rss_mib"] for r in results[m])  # type: ignore[type-var]
        wall = statistics.median(r["wall_s"] for r in results[m])  # type: ignore[misc]
        print(f"{m:9} {med[m]:9.1f} {min(steps[m]):8.1f} {max(steps[m]):8.1f} "
              f"{med[m] / med['plain']:8.3f}x {rss:13.0f} {wall:8.1f}")
    print(f"\npaired: each round's median step over the same round's plain median ({a.rounds} rounds)")
    for m in [m for m in results if m != "plain"]:
        ratios = paired_ratios(results, m)
        print(f"{m:9} {(statistics.median(ratios) - 1) * 100:+6.1f}% "
              f"(range {(min(ratios) - 1) * 100:+.1f}% to {(max(ratios) - 1) * 100:+.1f}%)")
    pct = {m: (med[m] / med["plain"] - 1) * 100 for m in results}
    if len(pct) < len(MODES):
        return
    paired = {m: (statistics.median(paired_ratios(results, m)) - 1) * 100 for m in MODES[1:]}
    print(f"\nlight {pct['light']:+.1f}% pooled, {paired['light']:+.1f}% paired (target <= 3%); "
          f"full {paired['full']:+.1f}% vs torch.profiler alone {paired['profiler']:+.1f}% paired "
          f"(target: full <= profiler + 5 points)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mingpt", nargs="?", default=None,
                    help="folder holding minGPT's mingpt/ and projects/chargpt/ (for --script chargpt)")
    ap.add_argument("--script", choices=(*SCRIPTS, "all"), default="chargpt")
    ap.add_argument("--imagenet-main", default=None, help="pytorch/examples' imagenet/main.py")
    ap.add_argument("--run-mae", default=None,
                    help="transformers' examples/pytorch/image-pretraining/run_mae.py (needs datasets)")
    ap.add_argument("--arch", default="resnet18", help="imagenet: a torchvision model name")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", dest="batch", type=int, default=None,
                    help="default: 16 chargpt, 8 imagenet, 8 hf_trainer")
    ap.add_argument("--workers", dest="num_workers", type=int, default=None,
                    help="DataLoader workers; default: 2 chargpt, 2 imagenet, 0 hf_trainer")
    ap.add_argument("--modes", default=",".join(MODES), help="a subset, comma-separated (plain always runs)")
    ap.add_argument("--top", type=int, default=5, help="how many of the heaviest layers to compare (light vs full)")
    a = ap.parse_args()
    a.modes = ["plain", *[m for m in MODES[1:] if m in a.modes.split(",")]]
    chosen = list(SCRIPTS.values()) if a.script == "all" else [SCRIPTS[a.script]]
    for script in chosen:
        _check(script, a)
    for script in chosen:
        bench_script(script, a)
    return 0


def _check(script: Script, a: argparse.Namespace) -> None:
    """Refuse early, with what to give, when a chosen script is missing or cannot run."""
    where = {"chargpt": "give a minGPT checkout (positional MINGPT)",
             "imagenet": "give pytorch/examples' imagenet/main.py (--imagenet-main)",
             "hf_trainer": "give transformers' run_mae.py (--run-mae)"}[script.name]
    path = script.path(a)
    if path is None or not Path(path).is_file():
        raise SystemExit(f"{script.name}: no script at {path}: {where}")
    if script.name == "hf_trainer":
        import importlib.util

        if importlib.util.find_spec("datasets") is None:
            raise SystemExit("hf_trainer: run_mae.py needs the datasets package: pip install datasets")


if __name__ == "__main__":
    raise SystemExit(main())
