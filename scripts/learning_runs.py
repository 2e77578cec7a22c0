"""The learning evidence: each tiny config (Pig, TicTacToe, Kuhn) trained from its format-only
start, with and without RAE, over several seeds; a table of the final numbers and RL gains, and a
plot.

    python scripts/learning_runs.py                       # the three configs, RAE on/off, seeds 0 1 2
    python scripts/learning_runs.py --configs configs/tiny_kuhn.py --seeds 0 --rae on
    python scripts/learning_runs.py --report-only         # redo the table from finished runs

Each run is `spiral-jax train` into runs/learning/<config>/rae_<on|off>/seed<k>/; its summary.json
holds the step-0 and final evaluations. The table is printed; it goes to docs/learning_ablation.md
and the plot to docs/learning_ablation.png after the whole default set or with --report-only (which
reads every finished run), never after a subset. Runs are sequential (each uses every core).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "runs" / "learning"


def run_dir(config: str, rae: str, seed: int) -> Path:
    return RUNS / Path(config).stem / f"rae_{rae}" / f"seed{seed}"


def train(config: str, rae: str, seed: int) -> None:
    out = run_dir(config, rae, seed)
    if (out / "summary.json").exists() and "final" in json.loads((out / "summary.json").read_text())["eval"]:
        print(f"{out}: done already")
        return
    cmd = [sys.executable, "-m", "spiral_jax.cli", "train", "--config", config, f"--config.seed={seed}",
           f"--config.rae.enabled={rae == 'on'}", f"--config.out_dir={out}"]
    if (out / "checkpoints").is_dir() and any((out / "checkpoints").iterdir()):
        cmd.append("--resume")  # an interrupted run continues
    elif out.exists():
        cmd.append("--overwrite")  # a run that died before its first checkpoint starts over
    print(" ".join(cmd), flush=True)
    start = time.time()
    subprocess.run(cmd, cwd=ROOT, check=True)
    print(f"{out}: {time.time() - start:.0f} s", flush=True)


def _stats(values) -> str:
    values = np.asarray(values, float)
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f} ({', '.join(f'{v:.3f}' for v in values)})"


def report(configs, seeds) -> tuple[str, dict]:
    """The table of every finished run, and the run folders of each (config, RAE) for the plot."""
    lines = ["| config | RAE | seeds | metric | step 0 | final | RL gain (final - step 0) | wall time (s) |",
             "|---|---|---|---|---|---|---|---|"]
    curves = {}
    for config in configs:
        for rae in ("on", "off"):
            summaries = [json.loads((run_dir(config, rae, s) / "summary.json").read_text())
                         for s in seeds if (run_dir(config, rae, s) / "summary.json").exists()]
            summaries = [s for s in summaries if "final" in s["eval"]]
            if not summaries:
                continue
            name, n = Path(config).stem, len(summaries)
            wall = _stats([s["wall_time_s"] for s in summaries])
            for key in summaries[0]["eval"]["final"]:
                if not key.endswith("/random"):
                    continue
                s0 = [s["eval"]["step0"][key]["win"] for s in summaries]
                fin = [s["eval"]["final"][key]["win"] for s in summaries]
                inv = [s["eval"]["final"][key]["invalid"] for s in summaries]
                lines.append(f"| {name} | {rae} | {n} | win vs random | {_stats(s0)} | {_stats(fin)} | "
                             f"{_stats(np.subtract(fin, s0))} | {wall} |")
                lines.append(f"| {name} | {rae} | {n} | invalid vs random | | {_stats(inv)} | | |")
            if all("kuhn" in s for s in summaries):
                e0 = [s["kuhn"]["step0"]["exploitability"] for s in summaries]
                e1 = [s["kuhn"]["final"]["exploitability"] for s in summaries]
                lines.append(f"| {name} | {rae} | {n} | Kuhn exploitability | {_stats(e0)} | {_stats(e1)} | "
                             f"{_stats(np.subtract(e1, e0))} | |")
            curves[name, rae] = [run_dir(config, rae, s) for s in seeds]
    return "\n".join(lines) + "\n", curves


def plot(curves, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spiral_jax.metrics import read_scalars

    names = sorted({name for name, _ in curves})
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for rae, colour in (("on", "tab:blue"), ("off", "tab:orange")):
            for i, out in enumerate(curves.get((name, rae), [])):
                if not (out / "tensorboard").exists():
                    continue
                scalars = read_scalars(out / "tensorboard")
                tag = "eval/kuhn/exploitability" if "eval/kuhn/exploitability" in scalars else next(
                    t for t in sorted(scalars) if t.startswith("eval/") and t.endswith("/random/win_rate"))
                steps, values = zip(*scalars[tag])
                ax.plot(steps, values, color=colour, alpha=0.8, label=f"RAE {rae}" if i == 0 else None)
                ax.set_title(f"{name}: {tag}", fontsize=9)
        ax.set_xlabel("RL step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+",
                   default=["configs/tiny_pig.py", "configs/tiny_tictactoe.py", "configs/tiny_kuhn.py"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rae", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    if not args.report_only:
        for config in args.configs:
            for rae in args.rae:
                for seed in args.seeds:
                    train(config, rae, seed)
    table, curves = report(args.configs, args.seeds)
    print(table)
    subset = [args.configs, args.seeds, args.rae] != [p.get_default(k) for k in ("configs", "seeds", "rae")]
    if subset and not args.report_only:
        return
    (ROOT / "docs").mkdir(exist_ok=True)
    (ROOT / "docs" / "learning_ablation.md").write_text(
        "# RAE ablation on the tiny configs\n\nMade by `python scripts/learning_runs.py` "
        "(mean ± sample standard deviation over seeds, then each seed).\n\n" + table)
    plot(curves, ROOT / "docs" / "learning_ablation.png")


if __name__ == "__main__":
    main()
