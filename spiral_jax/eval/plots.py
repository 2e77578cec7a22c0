"""Learning curves as PNG, read back from a run's TensorBoard event files (needs matplotlib).

    python -m spiral_jax.eval.plots runs/tiny_tictactoe [--out curves.png] [--panel 'eval/*/*/win_rate' ...]

Each pattern (shell-style, e.g. "eval/*/scripted/win_rate") is one panel with a line per matching
tag, so a report shows what the run logged without TensorBoard. The default panels are what a
self-play run is judged by: win and invalid rates per game and opponent, each role's mean reward,
the RAE baselines, the Kuhn exploitability and math scores where they were logged, and the loss.

No line hides another: series that are equal at every step are drawn once and labelled with every
tag they stand for, and a flat series gets a visible y range instead of one magnified to noise.
"""
from __future__ import annotations

import argparse
import fnmatch
import io
from typing import Sequence

from etils import epath

from spiral_jax.metrics import read_scalars
from spiral_jax.paths import run_path

# A game's evaluation tags are eval/GAME/OPPONENT/...: two parts, so the Kuhn policy estimate's
# eval/kuhn/invalid_rate (a share of answers, not of games) is not drawn as a game's.
DEFAULT_PANELS = ("eval/*/*/win_rate", "eval/*/*/invalid_rate", "rollout/*/role*/reward", "rae/baseline/*",
                  "eval/kuhn/exploitability", "eval/math/*/pass@1_first_sample", "train/loss",
                  "rollout/all/response_tokens")


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("plots need matplotlib: pip install 'spiral-jax[eval]'") from e
    return plt


def merge_equal(series: dict[str, list[tuple[int, float]]]) -> list[tuple[str, list[tuple[int, float]]]]:
    """Series that are equal at every step, as one line labelled "a = b": drawn apart, the later
    would hide the earlier."""
    merged: list[tuple[list[str], list[tuple[int, float]]]] = []
    for tag, points in series.items():
        same = next((m for m in merged if m[1] == points), None)
        if same is None:
            merged.append(([tag], points))
        else:
            same[0].append(tag)
    return [(" =\n".join(tags), points) for tags, points in merged]


def series_label(tag: str, pattern: str) -> str:
    """The tag without the pattern's fixed head and tail (the panel's title says those)."""
    wild = [i for i, c in enumerate(pattern) if c in "*?["]
    if not wild:
        return tag
    head, tail = pattern[:wild[0]], pattern[wild[-1] + 1:].lstrip("]")
    core = tag[len(head):len(tag) - len(tail)] if tag.startswith(head) and tag.endswith(tail) else tag
    return core or tag


def panel_tags(tags, panels: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Each pattern with the tags it draws, leaving out patterns that match none. Per-seat evaluation
    tags (.../seat0/...) only where a pattern asks for seats: the panels show each opponent's overall rate."""
    found = [(p, sorted(t for t in tags if fnmatch.fnmatchcase(t, p) and ("/seat" not in t or "seat" in p)))
             for p in panels]
    return [(p, matched) for p, matched in found if matched]


def learning_curves(logdir, path, panels: Sequence[str] = DEFAULT_PANELS) -> epath.Path:
    """One panel per pattern; patterns that match nothing are left out (an error if all are). `logdir`
    and `path` are local paths or URIs such as gs://b/run (read and written through run_path)."""
    scalars = read_scalars(logdir)
    found = panel_tags(scalars, panels)
    if not found:
        raise ValueError(f"no scalar in {logdir} matches any of {list(panels)}")
    plt = _pyplot()
    fig, axes = plt.subplots(len(found), 1, figsize=(8, 2.6 * len(found)), squeeze=False, sharex=True)
    for ax, (pattern, tags) in zip(axes[:, 0], found):
        lines = merge_equal({series_label(t, pattern): scalars[t] for t in tags})
        for label, points in lines:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="." if len(steps) < 30 else None, label=label)
        low = min(v for _, points in lines for _, v in points)
        high = max(v for _, points in lines for _, v in points)
        if high - low < 1e-6 + 0.02 * max(abs(low), abs(high)):  # flat: show it flat, not its noise
            pad = max(0.05, 0.1 * abs(high))
            ax.set_ylim(low - pad, high + pad)
        ax.set_title(pattern, fontsize=9)
        if len(lines) > 1 or lines[0][0] != pattern:
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    path = run_path(path)  # a folder gets curves.png; a name without a suffix gets .png, as matplotlib writes it
    path = path / "curves.png" if path.is_dir() else path if path.suffix else path.with_suffix(".png")
    image = io.BytesIO()  # matplotlib writes local files only; the bytes go through run_path (gs:// too)
    fig.savefig(image, format=path.suffix[1:], dpi=100, bbox_inches="tight")
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image.getvalue())
    return path


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Learning curves of a run as one PNG.")
    p.add_argument("run", help="the run's out_dir (or its tensorboard/ folder), a local folder or gs://")
    p.add_argument("--out", default="", help="the PNG to write (default <run>/curves.png)")
    p.add_argument("--panel", action="append", default=[], help="a tag pattern per panel (repeatable)")
    args = p.parse_args(argv)
    run = run_path(args.run)  # a gs:// out_dir stays one (pathlib makes gs://b/x the local gs:/b/x)
    logdir = run / "tensorboard" if (run / "tensorboard").is_dir() else run
    if not logdir.is_dir():
        p.exit(2, f"plots: {run} is not a folder; pass a run's out_dir\n")
    try:
        path = learning_curves(logdir, args.out or run / "curves.png", args.panel or DEFAULT_PANELS)
    except ValueError as e:  # nothing logged yet, or no panel matches
        p.exit(2, f"plots: {e}; pass a run's out_dir once it has logged a step, or other --panel patterns\n")
    except OSError as e:  # --out under a file, or where this user cannot write
        p.exit(2, f"plots: cannot write {e.filename or args.out}: {e.strerror or e}; pass --out a PNG path you "
                  f"can write\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
