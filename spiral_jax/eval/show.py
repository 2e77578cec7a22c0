"""Evaluation transcripts as readable markdown:

    python -m spiral_jax.eval.show <out_dir>/eval/step100/TicTacToe-v0_vs_random.jsonl [--games 3]
"""
from __future__ import annotations

import argparse
import json
from typing import Sequence

from spiral_jax.eval.transcripts import read_transcripts, to_markdown


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print evaluation transcripts (JSONL) as markdown.")
    p.add_argument("path", help="a transcripts file written by an evaluation")
    p.add_argument("--games", type=int, default=3, help="how many games (from the first)")
    args = p.parse_args(argv)
    if args.games < 1:
        p.error(f"--games {args.games}: give how many games to show, at least 1")
    try:
        lines = read_transcripts(args.path)
    except OSError as e:
        p.exit(2, f"show: cannot read {args.path}: {e.strerror or e}; pass a transcripts file from "
                  f"<out_dir>/eval/<step>/\n")
    except json.JSONDecodeError as e:  # a run stopped while writing its last game
        p.exit(2, f"show: {args.path} holds a line that is not JSON ({e.msg}); a run stopped while writing "
                  f"it leaves its last line cut off\n")
    if not lines:
        p.exit(0, f"show: no games in {args.path}\n")
    print(to_markdown(lines, args.games))


if __name__ == "__main__":
    main()
