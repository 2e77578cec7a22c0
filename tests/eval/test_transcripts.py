"""Transcripts: every game is a line, invalid games included, with per-move LLM details."""
import numpy as np
import pytest

from spiral_jax.envs import GameRecord, Turn
from spiral_jax.eval.game_report import write_report
from spiral_jax.eval.games import outcome, summarize
from spiral_jax.eval.transcripts import read_transcripts, write_transcripts
from spiral_jax.rollout import ModelTurn, PlayedGame


def _game(i, seats, turns, rewards, model_turns):
    return PlayedGame(GameRecord(i, "KuhnPoker-v2", 100 + i, turns, rewards, "end"), seats, model_turns)


def test_every_game_written_and_no_box_is_invalid(tmp_path):
    no_box = _game(0, ("model", "random"),
                   [Turn(0, "obs0", "I check", "", False), Turn(0, "obs0b", "hmm", "", False)],
                   {0: -1.5, 1: 0.5},
                   [ModelTurn(0, "model", [1, 2], [3], np.zeros(1), "stop"),
                    ModelTurn(0, "model", [1, 2], [4, 5], np.zeros(2), "length")])
    won = _game(1, ("random", "model"),
                [Turn(0, "o", "[bet]", "[bet]", True), Turn(1, "o2", "\\boxed{call}", "[call]", True)],
                {0: -2.0, 1: 2.0}, [ModelTurn(1, "model", [1], [7, 8, 9], np.zeros(3), "stop")])
    path = write_transcripts(tmp_path / "t" / "games.jsonl", [no_box, won],
                             extra={"temperature": 0.6, "top_p": 0.95})
    lines = read_transcripts(path)
    assert len(lines) == 2
    assert lines[0]["outcomes"] == {"0": "invalid"} and lines[1]["outcomes"] == {"1": "win"}
    assert [t["response_tokens"] for t in lines[0]["turns"]] == [1, 2]
    assert lines[0]["turns"][1]["finish_reason"] == "length"
    assert "response_tokens" not in lines[1]["turns"][0]  # the random opponent's move
    assert lines[1]["turns"][1]["response_tokens"] == 3
    assert all(line["temperature"] == 0.6 and line["top_p"] == 0.95 for line in lines)
    stats = summarize([no_box, won])
    assert stats.counts == {"win": 1, "draw": 0, "loss": 0, "invalid": 1}


def test_markdown_shows_each_move_past_the_repeated_rules(tmp_path):
    from spiral_jax.eval.show import main
    from spiral_jax.eval.transcripts import to_markdown

    rules = "Rules line one.\nRules line two.\n"
    turns = [Turn(0, rules + "Board A", "\\boxed{1}", "[1]", True), Turn(1, rules + "Board B", "[2]", "[2]", True),
             Turn(0, rules + "Board C", "oops", "", False)]
    game = _game(0, ("model", "random"), turns, {0: -1.5, 1: 0.5},
                 [ModelTurn(0, "model", [1], [2], np.zeros(1), "stop"), ModelTurn(0, "model", [1], [3], np.zeros(1), "stop")])
    path = write_transcripts(tmp_path / "g.jsonl", [game])
    text = to_markdown(read_transcripts(path))
    assert text.count("Rules line one.") == 2  # each player's first view in full
    assert "```\nBoard C\n```" in text and "`oops` -> (no move) (invalid)" in text
    assert "Outcome: seat 0 (model) invalid;" in text
    main([str(path), "--games", "1"])


def test_markdown_names_each_seat_of_a_game_between_two_llms(tmp_path):
    """In a game between two LLM policies (the model against a checkpoint), each outcome is labelled
    with the policy in that seat."""
    from spiral_jax.eval.transcripts import to_markdown

    turns = [Turn(0, "o", "[1]", "[1]", True), Turn(1, "o", "[2]", "[2]", True)]
    game = _game(0, ("ckpt", "model"), turns, {0: -1.0, 1: 1.0},
                 [ModelTurn(0, "ckpt", [1], [2], np.zeros(1), "stop"), ModelTurn(1, "model", [1], [3], np.zeros(1), "stop")])
    path = write_transcripts(tmp_path / "g.jsonl", [game], ("model", "ckpt"))
    assert "Outcome: seat 0 (ckpt) loss, seat 1 (model) win;" in to_markdown(read_transcripts(path))


def test_show_says_what_is_wrong_with_its_file(tmp_path, capsys):
    """A missing file, an empty one, a damaged line, a line that is not a game, the games.json report
    (said to be "not JSON text") and --games below 1 are one line each, not a traceback or a blank page."""
    from spiral_jax.eval.show import main

    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bytes.jsonl").write_bytes(b'\xff\xfe{}\n')
    (tmp_path / "list.jsonl").write_text('[1, 2]\n')
    (tmp_path / "shape.jsonl").write_text('{"env_id": "Nim-v0", "seats": null}\n')
    write_report({}, tmp_path)  # games.json, the report beside the transcripts
    for args, code, said in [([str(tmp_path / "nope.jsonl")], 2, "cannot read"),
                             ([str(tmp_path / "bytes.jsonl")], 2, "line 1 is not JSON text"),
                             ([str(tmp_path / "list.jsonl")], 2, "line 1 is not a JSON object"),
                             ([str(tmp_path / "shape.jsonl")], 2, "game 1 is not a transcript"),
                             ([str(tmp_path / "games.json")], 2, "is an evaluation report (rates), not transcripts; "
                                                                 "pass one of the <game>_vs_<opponent>.jsonl files"),
                             ([str(tmp_path / "empty.jsonl")], 0, "no games in"),
                             ([str(tmp_path / "empty.jsonl"), "--games", "-1"], 2, "--games -1: give how many")]:
        with pytest.raises(SystemExit) as exit_:
            main(args)
        assert exit_.value.code == code and said in capsys.readouterr().err


def test_show_prints_the_games_before_a_last_line_cut_off(tmp_path, capsys):
    """A run stopped while writing a game leaves its last line cut off (maybe inside a character):
    the games before it are shown, with a warning, and the file is left as it is."""
    from spiral_jax.eval.show import main

    game = _game(0, ("model", "random"), [Turn(0, "o", "[1]", "[1]", True)], {0: 1.0, 1: -1.0},
                 [ModelTurn(0, "model", [1], [2], np.zeros(1), "stop")])
    path = write_transcripts(tmp_path / "g ü.jsonl", [game])
    cut = path.read_bytes() + '{"env_id": "Nim-v0", "turns": [{"observation": "ü'.encode()[:-1]
    path.write_bytes(cut)
    assert len(read_transcripts(path)) == 1
    main([str(path)])
    out = capsys.readouterr()
    assert "Outcome: seat 0 (model) win" in out.out and "line 2 is cut off" in out.err
    assert path.read_bytes() == cut


def test_an_invalid_retry_cut_off_by_the_turn_limit_is_a_draw_for_both_seats():
    """Free-text games allow retries: when the move that reaches max_turns is an invalid retry, the
    runner ends the game as a draw (truncated), and no seat lost by an invalid move."""
    turns = [Turn(0, "o", "[ok]", "[ok]", True), Turn(1, "o", "[ok]", "[ok]", True), Turn(0, "o", "?", "?", False)]
    cut = GameRecord(0, "textarena:Free-v0", 1, turns, {0: 0.0, 1: 0.0}, "turn limit", truncated=True)
    assert [outcome(PlayedGame(cut, ("model", "random"), []), seat) for seat in (0, 1)] == ["draw", "draw"]
    ended = GameRecord(0, "textarena:Free-v0", 1, turns, {0: -1.0, 1: 0.0}, "invalid move")
    assert [outcome(PlayedGame(ended, ("model", "random"), []), seat) for seat in (0, 1)] == ["invalid", "win"]


def test_tensorboard_transcript_shows_every_line_of_a_response_as_written():
    """Each line of a response is indented into the code block: unindented, the lines after the first
    were rendered as markdown, a reasoning model's <think> as an HTML tag TensorBoard drops."""
    from spiral_jax.run.evaluate import transcript

    response = "<think>\nthe centre is free\n\n# best move\n</think>\n\\boxed{[4]}"
    game = _game(0, ("model", "random"), [Turn(0, "obs", response, "[4]", True)], {0: 1.0, 1: -1.0}, [])
    block = transcript(game).split("-> `[4]`\n\n")[1]
    assert block.splitlines() == ["    " + line for line in response.splitlines()]
