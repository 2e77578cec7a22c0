"""Evaluation transcripts as readable markdown:

    python -m spiral_jax.eval.show <out_dir>/eval/step100/TicTacToe-v0_vs_random.jsonl [--games 3]
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from spiral_jax.eval.transcripts import TranscriptError, read_transcripts, to_markdown
from spiral_jax.paths import run_path


def _is_report(path) -> bool:
    """Whether `path` holds a games.json / transfer.json report: one JSON document of settings and results."""
    try:
        report = json.loads(run_path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and "results" in report and "settings" in report


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print evaluation transcripts (JSONL) as markdown.")
    p.add_argument("path", help="a transcripts file written by an evaluation")
    p.add_argument("--games", type=int, default=3, help="how many games (from the first)")
    args = p.parse_args(argv)
    if args.games < 1:
        p.error(f"--games {args.games}: give how many games to show, at least 1")
    hint = "pass a transcripts file from <out_dir>/eval/<step>/"
    try:
        lines = read_transcripts(args.path, warn=lambda m: print(f"show: {args.path}: {m}", file=sys.stderr))
        text = to_markdown(lines, args.games)
    except OSError as e:
        p.exit(2, f"show: cannot read {args.path}: {e.strerror or e}; {hint}\n")
    except TranscriptError as e:  # a damaged file, or not one an evaluation wrote
        if _is_report(args.path):
            p.exit(2, f"show: {args.path} is an evaluation report (rates), not transcripts; pass one of the "
                      f"<game>_vs_<opponent>.jsonl files beside it\n")
        p.exit(2, f"show: {args.path}: {e}; {hint}, or write it again with spiral-jax eval --step STEP\n")
    if not lines:
        p.exit(0, f"show: no games in {args.path}\n")
    print(text)


if __name__ == "__main__":
    main()
