"""What a Nim policy does at the moments that decide games, read from evaluation transcripts.

For each of the model's valid moves in the given files (out_dir/eval/stepN/Nim-v0_vs_*.jsonl):

* finish: one pile is left; taking all of it wins at once. Did it?
* gift: two or more piles are left and some move leaves more than one; leaving exactly one pile lets
  the opponent win at once. How often did it do that anyway?
* optimal: a move leaving piles whose XOR is 0 exists (the winning move of perfect play). Did it
  make one?

Each is printed next to what a uniformly random legal move would score in the same positions.

    python scripts/nim_tactics.py runs/tiny_nim/eval/step0/Nim-v0_vs_random.jsonl \\
        runs/tiny_nim/eval/step100/Nim-v0_vs_random.jsonl
"""
from __future__ import annotations

import functools
import json
import re
import sys

_PILE = re.compile(r"^pile (\d+): (\d+)$", re.MULTILINE)


def piles(observation: str) -> list[int]:
    """The piles now: the last listing of every pile in the observation."""
    found = _PILE.findall(observation)
    n = len({i for i, _ in found})
    return [int(count) for _, count in found[-n:]]


def moves(p: list[int]) -> list[tuple[int, int]]:
    return [(i, k) for i, n in enumerate(p) for k in range(1, n + 1)]


def after(p: list[int], move: tuple[int, int]) -> list[int]:
    i, k = move
    return [n - k if j == i else n for j, n in enumerate(p)]


def left(p: list[int]) -> int:
    return sum(n > 0 for n in p)


def xor(p: list[int]) -> int:
    return functools.reduce(lambda a, b: a ^ b, p, 0)


def tactics(path: str) -> dict:
    counts = dict(finish=[0, 0, 0.0], gift=[0, 0, 0.0], optimal=[0, 0, 0.0])  # [made, chances, chance rate sum]

    def count(kind, made, good, legal):
        counts[kind][0] += made
        counts[kind][1] += 1
        counts[kind][2] += good / legal

    with open(path) as f:
        for game in map(json.loads, f):
            for turn in game["turns"]:
                if turn["policy"] != "model" or not turn["valid"]:
                    continue
                p = piles(turn["observation"])
                move = tuple(int(x) for x in turn["action"].strip("[]").split())
                legal = moves(p)
                if left(p) == 1:
                    count("finish", left(after(p, move)) == 0, 1, len(legal))
                elif any(left(after(p, m)) != 1 for m in legal):
                    count("gift", left(after(p, move)) == 1, sum(left(after(p, m)) == 1 for m in legal), len(legal))
                if left(p) > 1 and any(xor(after(p, m)) == 0 for m in legal):
                    count("optimal", xor(after(p, move)) == 0, sum(xor(after(p, m)) == 0 for m in legal), len(legal))
    return counts


def main(paths: list[str]) -> None:
    if not paths:
        sys.exit(__doc__)
    print("| transcripts | finishes taken (random mover) | piles gifted (random mover) | optimal moves (random mover) |")
    print("|---|---|---|---|")
    for path in paths:
        t = tactics(path)
        cell = lambda k: (f"{t[k][0]}/{t[k][1]} ({t[k][0] / max(t[k][1], 1):.0%}; "  # noqa: E731
                          f"{t[k][2] / max(t[k][1], 1):.0%})")
        print(f"| {path} | {cell('finish')} | {cell('gift')} | {cell('optimal')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
