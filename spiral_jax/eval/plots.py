"""Learning curves as PNG, read back from a run's TensorBoard event files (needs matplotlib).

Each pattern (shell-style, e.g. "eval/*/scripted/win_rate") is one panel with a line per matching
tag, so a report shows what the run logged without TensorBoard.
"""
from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import Sequence

from spiral_jax.metrics import read_scalars

DEFAULT_PANELS = ("eval/*/win_rate", "eval/*/invalid_rate", "train/loss", "rollout/all/response_tokens")


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install 'spiral-jax[eval]'") from e
    return plt


def learning_curves(logdir, path, panels: Sequence[str] = DEFAULT_PANELS) -> Path:
    """One panel per pattern; patterns that match nothing are left out (an error if all are)."""
    scalars = read_scalars(logdir)
    found = [(p, sorted(t for t in scalars if fnmatch.fnmatchcase(t, p))) for p in panels]
    found = [(p, tags) for p, tags in found if tags]
    if not found:
        raise ValueError(f"no scalar in {logdir} matches any of {list(panels)}")
    plt = _pyplot()
    fig, axes = plt.subplots(len(found), 1, figsize=(7, 2.6 * len(found)), squeeze=False)
    for ax, (pattern, tags) in zip(axes[:, 0], found):
        for tag in tags:
            steps, values = zip(*scalars[tag])
            ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=tag)
        ax.set_title(pattern, fontsize=9)
        ax.set_xlabel("step")
        if len(tags) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
