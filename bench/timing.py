"""Timing helpers shared by the bench scripts: wall time of a call, and best-of over rounds that
take turns between the sides being compared."""
import time


def timed(fn) -> float:
    """Wall seconds of one call of `fn`."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def best_of_interleaved(runs: dict, repeats: int) -> dict:
    """Best wall time of each callable over `repeats` rounds that take turns, so that a slow spell of a
    shared machine hits every side alike."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], timed(run))
    return best
