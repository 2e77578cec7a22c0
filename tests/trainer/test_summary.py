"""A run from a format-only start: step-0 evaluation, summary.json, per-role metrics, exact Kuhn
scoring with the token the model ends its turns with, and the online math evaluation."""
import json

import numpy as np
import pytest

from spiral_jax.envs import INFO_SETS
from spiral_jax.eval.games import table_row
from spiral_jax.eval.suite import run_kuhn
from spiral_jax.metrics import read_scalars
from spiral_jax.run import Trainer
from spiral_jax.cli import main as cli_main
from tests.trainer.test_trainer import _config_file, tiny_config


def _kuhn_changes(math) -> dict:
    return {"eval.math.every": 1, "eval.math.files": (f"toy={math}",), "eval.math.samples": 2,
            "eval.math.max_new_tokens": 6, "eval.math.temperature": 0.9, "eval.math.instruction_first": True,
            "games.env_ids": ("KuhnPokerChips-v0",), "train.steps": 2, "train.eval_every": 1,
            "eval.kuhn_samples": 0, "eval.final_games": 8, "eval.opponents": ("random",),
            "bootstrap.enabled": True, "bootstrap.teacher": "random", "bootstrap.steps": 150,
            "bootstrap.batch_size": 16, "bootstrap.learning_rate": 3e-3, "rae.games_per_shard": 2}


@pytest.fixture(scope="module")
def kuhn_run(tmp_path_factory):
    """150 bootstrap steps imitating random legal moves on one-round Kuhn (enough for the format),
    then 2 self-play steps; Kuhn exploitability by exact scoring at step 0 and at the end; a
    two-item math file every step."""
    tmp = tmp_path_factory.mktemp("kuhn")
    math = tmp / "toy.jsonl"
    math.write_text('{"problem": "What is 1+1?", "answer": "2"}\n{"problem": "What is 2+5?", "answer": "7"}\n')
    c = tiny_config(tmp, **_kuhn_changes(math))
    lines = []
    trainer = Trainer.from_config(c, log=lines.append, config_file="configs/tiny_kuhn.py")
    results = trainer.run()
    return trainer, results, lines, tmp / "run"


def test_summary_json_has_step0_and_final(kuhn_run):
    trainer, results, lines, out = kuhn_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"] == "configs/tiny_kuhn.py" and summary["steps"] == 2
    assert summary["wall_time_s"] > 0 and summary["bootstrap"] == {"teacher": "random", "steps": 150}
    for point in ("step0", "final"):
        row = summary["eval"][point]["KuhnPokerChips-v0/random"]
        assert row["games"] == 8
        assert row["win"] + row["draw"] + row["loss"] + row["invalid"] == pytest.approx(1.0, abs=1e-3)
        assert all(row[f"{w}_ci"][0] <= row[w] <= row[f"{w}_ci"][1] for w in ("win", "draw", "loss", "invalid"))
        kuhn = summary["kuhn"][point]
        assert set(kuhn["policy"]) == set(INFO_SETS) and kuhn["exploitability"] > 0
    final = results["KuhnPokerChips-v0", "random"]
    assert summary["eval"]["final"]["KuhnPokerChips-v0/random"]["win"] == pytest.approx(final.rate("win"), abs=1e-4)
    assert summary["rl_gain"]["KuhnPokerChips-v0/random"] == pytest.approx(
        summary["eval"]["final"]["KuhnPokerChips-v0/random"]["win"]
        - summary["eval"]["step0"]["KuhnPokerChips-v0/random"]["win"], abs=1e-4)
    table = lines[-2]  # then the closing line
    assert "vs random, step 0" in table and "vs random, step 2" in table and "at step 0 ->" in table
    step0, final_row = (next(r for r in table.splitlines() if f"vs random, step {n} |" in r) for n in (0, 2))
    assert step0.count("[") == final_row.count("[") == 4  # every outcome's interval, in both rows
    # A summary.json that kept the win rate's interval alone still prints its step-0 row.
    older = {"games": 8, "win": 0.5, "draw": 0.0, "loss": 0.5, "invalid": 0.0, "win_ci": [0.2, 0.8]}
    assert table_row("old", older) == "| old | 8 |  50.0% [20.0,  80.0] |   0.0% |  50.0% |   0.0% |"
    assert "after 2 steps (temperature 0.6, top-p 0.95, both seats" in table
    assert lines[-1].startswith("done: outputs are in")


def test_spiral_jax_eval_on_a_checkpoint_replays_the_runs_evaluation(kuhn_run):
    """`spiral-jax eval --step 0` plays the very games the run evaluated at step 0, so its rows are
    summary.json's step-0 rows; on the newest checkpoint, the final rows."""
    _, _, _, out = kuhn_run
    summary = json.loads((out / "summary.json").read_text())
    config = _config_file(out.parent, **_kuhn_changes(out.parent / "toy.jsonl"))
    for step, point in ((0, "step0"), (None, "final")):
        report = out / "eval" / f"again_{point}"
        flags = [f"--step={step}"] if step is not None else []
        assert cli_main(["spiral-jax", "eval", f"--config={config}", f"--eval_out={report}", *flags]) == 0
        rows = json.loads((report / "games.json").read_text())["results"]
        assert {f"{r['env_id']}/{r['opponent']}": r["summary"] for r in rows} == summary["eval"][point], point


def test_step0_evaluation_is_logged_before_any_update(kuhn_run):
    _, _, _, out = kuhn_run
    scalars = read_scalars(out / "tensorboard")
    wins = scalars["eval/KuhnPokerChips-v0/random/win_rate"]
    # step 0, the periodic one at step 1, the final one at step 2 (no second eval at the last step)
    assert [step for step, _ in wins] == [0, 1, 2]
    assert [step for step, _ in scalars["eval/kuhn/exploitability"]] == [0, 1, 2]
    assert [step for step, _ in scalars["train/loss"]] == [1, 2]


def test_math_benchmarks_run_at_step0_every_math_every_steps_and_at_the_end(kuhn_run):
    """eval.math: results per step in eval/step<N>/math/, TensorBoard eval/math/<name>/..., and the step-0
    and final rows in summary.json, which agree with the graded items on disk; sampled and prompted as
    eval.math says."""
    _, _, lines, out = kuhn_run
    scalars = read_scalars(out / "tensorboard")
    assert [step for step, _ in scalars["eval/math/toy/pass@1_first_sample"]] == [0, 1, 2]
    assert sum("math benchmarks toy" in line for line in lines) == 3
    summary = json.loads((out / "summary.json").read_text())
    for point, step in (("step0", 0), ("final", 2)):
        items = [json.loads(line) for line in (out / "eval" / f"step{step}" / "math" / "toy.items.jsonl").open()]
        assert len(items) == 2 and all(len(item["responses"]) == 2 for item in items)
        assert all(item["prompt"].startswith("Think it through") for item in items)  # instruction first
        row = summary["math"][point]["toy"]
        assert row["items"] == 2 and row["samples"] == 2
        assert row["pass@1"] == np.mean([item["first_correct"] for item in items])
        assert row["mean_accuracy"] == np.mean([c for item in items for c in item["correct"]])
        settings = json.loads((out / "eval" / f"step{step}" / "math" / "results.json").read_text())[0]["settings"]
        assert settings["temperature"] == 0.9 and settings["max_new_tokens"] == 6
        assert settings["instruction"] == "before the question"


def test_math_every_without_files_or_with_a_missing_file_fails_before_the_run(tmp_path):
    with pytest.raises(ValueError, match="eval.math.every needs eval.math.files"):
        Trainer.from_config(tiny_config(tmp_path, **{"eval.math.every": 4}))
    with pytest.raises(FileNotFoundError, match="no such file"):
        Trainer.from_config(tiny_config(tmp_path, **{"eval.math.every": 4, "eval.math.files": ("aime=/no/such.jsonl",)}))


def test_per_role_rewards_and_zero_advantage_share_are_logged(kuhn_run):
    trainer, _, _, out = kuhn_run
    scalars = read_scalars(out / "tensorboard")
    r0 = scalars["rollout/KuhnPokerChips-v0/role0/reward"]
    r1 = scalars["rollout/KuhnPokerChips-v0/role1/reward"]
    assert len(r0) == len(r1) == 2
    games = scalars["rollout/games"]
    for (_, a), (_, b) in zip(r0, r1):  # zero-sum, except invalid moves (-1.5 / +0.5)
        assert -1.5 <= a + b <= 1.5 and a != 0.0
    dropped = [v for _, v in scalars["rollout/zero_advantage_dropped"]]
    assert all(0.0 <= v < 1.0 for v in dropped) and len(games) == 2
    assert all(v >= 16 for _, v in scalars["rollout/samples_before_selection"])
    assert any(k.endswith("@0") for k in trainer.state.rae["baselines"])  # sharded baselines
    assert "rae/baseline/KuhnPokerChips-v0/0" in scalars


def test_exact_kuhn_scoring_uses_the_end_of_turn_token(kuhn_run):
    """The bootstrap ends answers with <|im_end|>; scored with it the answers hold most of the
    probability. Scored with <|endoftext|> they hold almost none, and that is an error, not 100%
    invalid information sets."""
    trainer, _, _, out = kuhn_run
    tok = trainer.tokenizer
    assert tok.end_of_turn_id == tok.hf.convert_tokens_to_ids("<|im_end|>")
    ctx = trainer.eval_context()
    est = run_kuhn(ctx, out / "kuhn_check", env_id="KuhnPokerChips-v0")
    coverage = 1 - np.mean(list(est.invalid_rate.values()))
    assert coverage > 0.9
    other = tok.hf.convert_tokens_to_ids("<|endoftext|>")
    from spiral_jax.eval import kuhn_policy
    probs = kuhn_policy.model_prob_fn(ctx.params, ctx.cfg, tok, end_ids=[other])
    with pytest.raises(ValueError, match="exact Kuhn scoring"):
        kuhn_policy.estimate_exact(probs, "KuhnPokerChips-v0", min_coverage=0.5)


def test_a_run_of_no_steps_prints_each_evaluation_once(tmp_path):
    """train.steps=0 (a bootstrap-only run): the step-0 and final evaluations are the same point, one row
    each; eval.temperature=0 evaluates greedily, and the table says so."""
    c = tiny_config(tmp_path, **{"train.steps": 0, "eval.final_games": 2, "eval.opponents": ("random",),
                                 "eval.temperature": 0.0})
    lines = []
    Trainer.from_config(c, log=lines.append).run()
    table = lines[-2]
    assert table.count("TicTacToe-v0 vs random, step 0") == 1 and "after 0 steps (greedy, both seats" in table
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert set(summary["eval"]) == {"step0", "final"} and summary["steps"] == 0


def test_a_resume_of_a_finished_run_evaluates_again_only_under_another_config(tmp_path):
    """`train --resume` of a run that finished: under the same config summary.json's final evaluation
    stands (the table is printed from it, nothing is played); under another one it is made again."""
    changes = {"train.steps": 0, "eval.final_games": 2, "eval.opponents": ("random",)}
    first = []
    Trainer.from_config(tiny_config(tmp_path, **changes), log=first.append).run()
    path = tmp_path / "run" / "summary.json"
    recorded = path.read_text()
    again = []
    assert Trainer.from_config(tiny_config(tmp_path, **changes), resume=True, log=again.append).run() == {}
    assert path.read_text() == recorded and again[-1] == first[-2]  # the same table, from the file
    assert "nothing is run again" in again[-2] and not any("[eval]" in line for line in again)
    other = []
    results = Trainer.from_config(tiny_config(tmp_path, **{**changes, "eval.final_games": 4}), resume=True,
                                  log=other.append).run()
    assert results["TicTacToe-v0", "random"].games == 4
    summary = json.loads(path.read_text())
    assert summary["eval"]["final"]["TicTacToe-v0/random"]["games"] == 4
    assert summary["eval"]["step0"]["TicTacToe-v0/random"]["games"] == 2  # kept: step 0 is not evaluated again


def test_a_summary_json_that_cannot_be_read_back_is_set_aside_not_a_crash(tmp_path):
    """A damaged summary.json (cut off, not UTF-8, a list, rows without rates) found by a resumed run
    at its final evaluation: the run does not stop over it; the file is set aside under a new name
    each time, said in one line, and the record starts again from the skeleton."""
    from spiral_jax.eval.games import GameStats
    from spiral_jax.run.summary import RunSummary

    stats = GameStats(2, {"win": 1, "draw": 0, "loss": 1, "invalid": 0},
                      {0: {"win": 1, "draw": 0, "loss": 0, "invalid": 0}, 1: {"win": 0, "draw": 0, "loss": 1, "invalid": 0}},
                      3.0, 5.0, 0.0)
    path, logged = tmp_path / "summary.json", []
    damaged = [b'{"eval": {"step0": {"Nim-v0/random": {"win"', b'{"eval": {}, "seed": "\xff"}', b"[]",
               b'{"eval": {"step0": {"Nim-v0/random": {"games": 2}}}}', b'{"eval": {}, "kuhn": {"step0": 1}}']
    for n, data in enumerate(damaged, 1):
        path.write_bytes(data)
        summary = RunSummary(path, {"seed": 0, "eval": {}}, log=logged.append)
        summary.record_games("final", 4, {("Nim-v0", "random"): stats}, None)
        assert json.loads(path.read_text())["eval"]["final"]["Nim-v0/random"]["win"] == 0.5
        aside = path.with_name("summary.json.unreadable" + (f"-{n}" if n > 1 else ""))
        assert aside.read_bytes() == data and len(logged) == n and "set aside as" in logged[-1]
    assert "Nim-v0 vs random, step 4 |" in summary.table(4, type("S", (), {"greedy": True}), tmp_path / "tensorboard")
    # An evaluation without a Kuhn estimate drops the one an earlier process recorded at its point.
    on_file = json.loads(path.read_text())
    path.write_text(json.dumps({**on_file, "kuhn": {"step0": {"exploitability": 0.3}, "final": {"exploitability": 0.2}}}))
    summary.record_games("final", 4, {("Nim-v0", "random"): stats}, None)
    assert json.loads(path.read_text())["kuhn"] == {"step0": {"exploitability": 0.3}}
    assert "Kuhn" not in summary.table(4, type("S", (), {"greedy": True}), tmp_path / "tensorboard")
