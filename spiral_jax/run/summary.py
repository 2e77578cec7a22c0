"""out_dir/summary.json: a run's headline results, and the final table printed from them.

The file is the run's record of its step-0 and final evaluations (games, Kuhn exploitability, math
benchmarks), the RL gain between them and the wall time. It is replaced whole at each write, so a
crash leaves the previous version; a resumed run reads it back and adds to it. Its fields are
described in docs/learning.md.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spiral_jax.eval.games import TABLE_HEADER, table_row
from spiral_jax.paths import replace_text

_ROW = ("games", "win", "draw", "loss", "invalid")  # what `table` and the RL gain read of an evaluation


class RunSummary:
    """summary.json of one run. `skeleton` is its content before the first evaluation; `write` is
    False on every host but the leader, which alone writes files."""

    def __init__(self, path: Path, skeleton: dict, write: bool = True, log=print):
        self.path, self.skeleton, self.write, self.log = path, skeleton, write, log

    def read(self) -> dict:
        """The summary as written so far (the skeleton before the step-0 evaluation). A summary.json
        that cannot be read back (damaged, or not as this class writes it) is set aside as
        summary.json.unreadable, said to `log`, and the record starts again: a run never stops over it."""
        if self.path.exists():
            try:
                summary = json.loads(self.path.read_text())
                _check(summary)
                return summary
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                if self.write:
                    aside, n = self.path.with_name(f"{self.path.name}.unreadable"), 1
                    while aside.exists():  # set aside before: keep that one too
                        n += 1
                        aside = self.path.with_name(f"{self.path.name}.unreadable-{n}")
                    self.path.rename(aside)
                    self.log(f"{self.path} cannot be read ({type(e).__name__}: {e}); set aside as {aside.name}, "
                             f"and the run's results are recorded anew")
        return json.loads(json.dumps(self.skeleton))  # a fresh copy each time

    def _replace(self, summary: dict) -> None:
        if self.write:
            replace_text(self.path, json.dumps(summary, indent=1) + "\n")

    def record_games(self, point: str, step: int, results: dict, kuhn, wall_time_s: float | None = None,
                     config_json: str | None = None) -> None:
        """The evaluation at `point` ("step0" or "final"): {(env id, opponent): GameStats} and the
        Kuhn estimate (or None); `wall_time_s`, when given, is the run's wall time so far, resumes
        included; `config_json`, when given, is the config evaluated under, kept as its hash."""
        summary = self.read()
        if config_json is not None:
            summary[f"{point}_config_sha256"] = _sha256(config_json)
        summary["eval"][point] = {f"{env_id}/{opp}": stats.summary() for (env_id, opp), stats in results.items()}
        if kuhn is not None:
            summary.setdefault("kuhn", {})[point] = {"exploitability": kuhn.exploitability.exploitability,
                                                     "policy": dict(kuhn.aggression)}
        else:  # not estimated this time: an earlier process's estimate is not this evaluation's
            summary.get("kuhn", {}).pop(point, None)
        summary["steps"] = step
        if wall_time_s is not None:
            summary["wall_time_s"] = round(wall_time_s, 1)
        if "step0" in summary["eval"] and "final" in summary["eval"]:
            summary["rl_gain"] = {k: round(v["win"] - summary["eval"]["step0"][k]["win"], 4)
                                  for k, v in summary["eval"]["final"].items() if k in summary["eval"]["step0"]}
        self._replace(summary)

    def record_math(self, point: str, results: list) -> None:
        """Math benchmark results ([BenchmarkResult]) at `point` go into the `math` section."""
        if not results:
            return
        summary = self.read()
        summary.setdefault("math", {})[point] = {
            r.name: {"items": r.items, "samples": r.samples_per_item, "pass@1": r.pass_at_1,
                     "pass@1_ci": list(r.pass_at_1_ci), "mean_accuracy": r.mean_accuracy,
                     "boxed": r.boxed_rate, "truncated": r.truncated_rate} for r in results}
        self._replace(summary)

    def final_recorded(self, step: int, config_json: str) -> bool:
        """Whether the final evaluation of `step` is recorded, made under this very config."""
        summary = self.read()
        return ("final" in summary["eval"] and summary["steps"] == step
                and summary.get("final_config_sha256") == _sha256(config_json))

    def table(self, step: int, sampling, tensorboard: Path) -> str:
        """The final evaluation as recorded, each row under its step-0 row (the RL gain), and where to
        look. sampling: the evaluation's SamplingParams, named in the title."""
        summary = self.read()
        start, final = summary["eval"].get("step0", {}), summary["eval"]["final"]
        how = "greedy" if sampling.greedy else f"temperature {sampling.temperature}, top-p {sampling.top_p}"
        lines = [f"\nfinal evaluation after {step} steps ({how}, both "
                 f"seats; invalid = lost by an invalid move)", TABLE_HEADER]
        for key, row in final.items():
            name = key.replace("/", " vs ", 1)  # "<game>/<opponent>"; an opponent may be a path
            before = start.get(key) if step else None  # a run of 0 steps: one row
            if before:
                lines.append(table_row(f"{name}, step 0", before))
            lines.append(table_row(f"{name}, step {step}", row))
        kuhn = summary.get("kuhn", {})
        if "final" in kuhn:
            was = f"{kuhn['step0']['exploitability']:.3f} at step 0 -> " if "step0" in kuhn else ""
            lines.append(f"\nKuhn exploitability (one round, chips/hand): {was}"
                         f"{kuhn['final']['exploitability']:.3f} at step {step}")
        lines.append(f"\nsummary: {self.path}; curves: tensorboard --logdir {tensorboard}")
        return "\n".join(lines)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check(summary: dict) -> None:
    """Raise where `summary` lacks what RunSummary reads back: each evaluation row's rates and
    interval, each Kuhn point's exploitability, a `math` mapping."""
    for point, rows in summary["eval"].items():
        for key, row in rows.items():
            if len(row["win_ci"]) != 2 or not all(isinstance(row[k], (int, float)) for k in _ROW):
                raise ValueError(f"eval.{point}.{key} is not an evaluation's rates")
    if not all(isinstance(p["exploitability"], (int, float)) for p in summary.get("kuhn", {}).values()):
        raise ValueError("a kuhn entry has no exploitability")
    if not isinstance(summary.get("math", {}), dict):
        raise ValueError("math is not an object")
