"""Game evaluation on a tiny random model: every game counted (no box = invalid), files written."""
import json

import pytest

from spiral_jax.eval.game_report import evaluate_games, transfer_report, write_report
from spiral_jax.eval.transcripts import read_transcripts


@pytest.fixture
def rollout(tiny_ctx):
    return tiny_ctx.rollout


SETTINGS = {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 8}


def test_no_box_is_invalid_and_every_game_counts(tiny_model, rollout, tmp_path):
    params = tiny_model[1]
    results = evaluate_games(rollout, params, ["TicTacToe-v0"], ["random", "self"], 4, seed=0,
                             out_dir=tmp_path, settings=SETTINGS)
    vs_random, vs_self = results["TicTacToe-v0", "random"], results["TicTacToe-v0", "self"]
    assert sum(vs_random.counts.values()) == 4 and vs_random.games == 4
    assert all(sum(vs_random.seat_counts[s].values()) == 2 for s in (0, 1))
    # against itself (a second copy named "self"), each game counts once, from the model's seat
    assert sum(vs_self.counts.values()) == 4 and all(sum(vs_self.seat_counts[s].values()) == 2 for s in (0, 1))
    lines = read_transcripts(tmp_path / "TicTacToe-v0_vs_random.jsonl")
    assert len(lines) == 4 and all(line["settings"] == SETTINGS for line in lines)
    for line in lines:
        (seat, result), = line["outcomes"].items()
        model_moves = [t for t in line["turns"] if t["player"] == int(seat)]
        if result == "invalid":  # 8 random tokens: no box, the game is an invalid loss, not dropped
            assert not model_moves[-1]["valid"]
    invalid = sum(line["outcomes"][s] == "invalid" for line in lines for s in line["outcomes"])
    assert invalid == vs_random.counts["invalid"] > 0
    self_lines = read_transcripts(tmp_path / "TicTacToe-v0_vs_self.jsonl")
    assert all(len(line["outcomes"]) == 2 for line in self_lines)

    md = write_report(results, tmp_path, SETTINGS)
    data = json.loads((tmp_path / "games.json").read_text())
    assert data["settings"] == SETTINGS and len(data["results"]) == 2
    row = data["results"][0]
    assert row["counts"] == vs_random.counts
    assert row["seat0"]["invalid"] == {"rate": vs_random.rate("invalid", 0),
                                       "ci95": list(vs_random.interval("invalid", 0))}
    text = md.read_text()
    assert "| TicTacToe-v0 | random | both | 4 |" in text and '"temperature": 0.6' in text


def test_odd_game_count_rejected(tiny_model, rollout):
    with pytest.raises(ValueError, match="even"):
        evaluate_games(rollout, tiny_model[1], ["Nim-v0"], ["random"], 3, seed=0)


@pytest.mark.slow
def test_transfer_report_all_six_games(tiny_model, rollout, tmp_path):
    results = transfer_report(rollout, tiny_model[1], tmp_path, n_games=2, seed=1, opponents=("random",))
    assert len(results) == 6 and all(s.games == 2 for s in results.values())
    assert (tmp_path / "transfer.md").read_text().count("| both |") == 6


def test_only_the_leader_writes_the_transfer_report(tmp_path, monkeypatch):
    """Every host of a multi-host run holds the results; one writes them to the shared out_dir."""
    from spiral_jax.eval import game_report

    monkeypatch.setattr(game_report, "evaluate_games", lambda *args, **kwargs: {})
    monkeypatch.setattr(game_report, "is_leader", lambda: False)
    transfer_report(None, None, tmp_path, n_games=2, seed=0)
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(game_report, "is_leader", lambda: True)
    transfer_report(None, None, tmp_path, n_games=2, seed=0)
    assert (tmp_path / "transfer.md").is_file()


def test_moves_an_api_opponent_did_not_answer_are_in_the_report(tmp_path):
    """Each such move is the API player's invalid move, a game the model wins: games.json and games.md
    say how many there were (they were in TensorBoard alone, which `spiral-jax eval` does not write)."""
    from spiral_jax.eval.games import GameStats

    def stats(failures):
        return GameStats(2, {"win": 2, "draw": 0, "loss": 0, "invalid": 0},
                         {0: {"win": 1, "draw": 0, "loss": 0, "invalid": 0},
                          1: {"win": 1, "draw": 0, "loss": 0, "invalid": 0}}, 3.0, 8.0, 0.0, failures)

    api = "openai:m@http://h/v1"
    write_report({("Nim-v0", api): stats(5), ("Nim-v0", "random"): stats(None)}, tmp_path, SETTINGS)
    rows = json.loads((tmp_path / "games.json").read_text())["results"]
    assert rows[0]["api_failures"] == 5 and "api_failures" not in rows[1]
    text = (tmp_path / "games.md").read_text()
    assert f"{api} on Nim-v0: 5 moves got no usable reply from the API" in text and text.count("no usable") == 1
    write_report({("Nim-v0", api): stats(0)}, tmp_path, SETTINGS)  # every move answered: nothing to say
    assert "no usable reply" not in (tmp_path / "games.md").read_text()


def test_a_new_report_removes_the_transcripts_of_matchups_no_report_lists(tmp_path):
    """Evaluating again into the same folder against other opponents replaces games.json; the old
    matchups' transcripts go with it, and those another report there (transfer.json) lists stay."""
    from spiral_jax.eval.games import GameStats
    from spiral_jax.paths import transcript_path

    stats = GameStats(2, {"win": 2, "draw": 0, "loss": 0, "invalid": 0},
                      {0: {"win": 1, "draw": 0, "loss": 0, "invalid": 0},
                       1: {"win": 1, "draw": 0, "loss": 0, "invalid": 0}}, 3.0, 8.0, 0.0)
    def evaluated(matchups, name="games"):  # as evaluate_games does: the transcripts, then the report
        for env_id, opponent in matchups:
            transcript_path(tmp_path, env_id, opponent).write_text("{}\n")
        write_report({matchup: stats for matchup in matchups}, tmp_path, SETTINGS, name=name)

    (tmp_path / "notes_vs_me.txt").write_text("a user's file")
    (tmp_path / "results.json").write_text("[]")  # benchmarks' results: not a game report
    evaluated([("Nim-v0", "random"), ("Nim-v0", "scripted")])
    evaluated([("Snake-v0", "scripted")], name="transfer")
    assert len(list(tmp_path.glob("*.jsonl"))) == 3
    evaluated([("Nim-v0", "scripted")])
    assert sorted(p.name for p in tmp_path.glob("*_vs_*")) == [
        "Nim-v0_vs_scripted.jsonl", "Snake-v0_vs_scripted.jsonl", "notes_vs_me.txt"]
