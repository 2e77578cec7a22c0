"""Evaluation transcripts as readable markdown:

    python -m spiral_jax.eval.show <out_dir>/eval/step100/TicTacToe-v0_vs_random.jsonl [--games 3]
"""
from __future__ import annotations

import argparse
from typing import Sequence

from spiral_jax.eval.transcripts import read_transcripts, to_markdown


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Print evaluation transcripts (JSONL) as markdown.")
    p.add_argument("path", help="a transcripts file written by an evaluation")
    p.add_argument("--games", type=int, default=3, help="how many games (from the first)")
    args = p.parse_args(argv)
    print(to_markdown(read_transcripts(args.path), args.games))


if __name__ == "__main__":
    main()
