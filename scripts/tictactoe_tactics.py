"""What a TicTacToe policy does at the moments that decide games, read from evaluation transcripts.

For each of the model's valid moves in the given files (out_dir/eval/stepN/TicTacToe-v0_vs_*.jsonl):
when it could complete a line, did it (a win taken)? Otherwise, when the opponent could complete one
next move, did it take that cell (a block)? And which cell does it open with on an empty board? A
policy that has learned tactics takes nearly every win and blocks most threats; one that has learned
only an opening does not.

    python scripts/tictactoe_tactics.py runs/tiny_tictactoe/eval/step0/TicTacToe-v0_vs_random.jsonl \\
        runs/tiny_tictactoe/eval/step100/TicTacToe-v0_vs_random.jsonl
"""
from __future__ import annotations

import collections
import json
import sys

from spiral_jax.envs.tictactoe import LINES

BOARD_HEADER = "Board (free cells show their numbers):\n"


def board(observation: str) -> tuple[str, list[str]]:
    """(the mover's mark, the 9 cells: 'X', 'O' or the free cell's number) from an observation."""
    mark = observation.split("and place '")[1][0]
    rows = observation.split(BOARD_HEADER)[1].split("\n")[:3]
    return mark, " ".join(rows).split()


def completing(cells: list[str], mark: str) -> set[int]:
    """The free cells that would complete a line of `mark`."""
    return {i for line in LINES if [cells[j] for j in line].count(mark) == 2
            for i in line if cells[i] not in ("X", "O")}


def tactics(path: str) -> dict:
    wins = blocks = 0
    win_chances = threats = 0
    openings = collections.Counter()
    with open(path) as f:
        for game in map(json.loads, f):
            for turn in game["turns"]:
                if turn["policy"] != "model" or not turn["valid"]:
                    continue
                mark, cells = board(turn["observation"])
                move = int(turn["action"].strip("[]"))
                mine, theirs = completing(cells, mark), completing(cells, "X" if mark == "O" else "O")
                if mine:
                    win_chances += 1
                    wins += move in mine
                elif theirs:
                    threats += 1
                    blocks += move in theirs
                if not any(c in ("X", "O") for c in cells):
                    openings[move] += 1
    return dict(wins=wins, win_chances=win_chances, blocks=blocks, threats=threats, openings=openings)


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit(__doc__)
    print("| transcripts | wins taken | threats blocked | openings (cell: games) |\n|---|---|---|---|")
    for path in paths:
        t = tactics(path)
        rate = lambda k, n: f"{t[k]}/{t[n]} ({t[k] / max(t[n], 1):.0%})"  # noqa: E731
        openings = ", ".join(f"{cell}: {n}" for cell, n in t["openings"].most_common(3))
        print(f"| {path} | {rate('wins', 'win_chances')} | {rate('blocks', 'threats')} | {openings} |")


if __name__ == "__main__":
    main(sys.argv[1:])
