"""`spiral-jax eval`: its flags checked against the config before any weights load (`check_eval_args`),
and what the suites then play, read and write."""
import json
from types import SimpleNamespace

import pytest

from spiral_jax.config import base_config
from spiral_jax.eval.benchmarks import load_items
from spiral_jax.run.evaluate import check_eval_args
from spiral_jax.run.setup import run_spec
from tests.test_paths import out  # noqa: F401 (the out_dir fixture: a local folder, then a gs:// one)
from tests.tiny_models import TINY


def args(**kw):
    base = dict(suite="games", games=0, eval_out="", opponents=[], env_ids=[], players=[], crossplay_env="Nim-v0",
                kuhn_samples=0, bench=[], samples=1, shots_file="", shots=0, limit=0, protocol="", step=-1)
    return SimpleNamespace(**{**base, **kw})


def spec(tmp_path, **evaluation):
    c = base_config()
    c.out_dir = str(tmp_path)
    c.eval.update(evaluation)
    return run_spec(c)


@pytest.mark.parametrize("suite, more", [("games", {}), ("transfer", {}), ("crossplay", dict(opponents=["random"]))])
def test_no_games_to_play_is_refused_before_the_weights_load(suite, more, tmp_path):
    """Without --games a suite plays eval.final_games per matchup; a config that sets it to 0 (no final
    evaluation) would leave nothing to play and fail only once the weights are loaded."""
    with pytest.raises(ValueError, match=f"--suite {suite} plays eval.final_games .* 0 .*give --games N"):
        check_eval_args(spec(tmp_path, final_games=0), args(suite=suite, **more))
    check_eval_args(spec(tmp_path, final_games=0), args(suite=suite, games=2, **more))
    check_eval_args(spec(tmp_path, final_games=0), args(suite="kuhn"))  # plays no games


@pytest.mark.parametrize("flag, given, said", [
    ("opponents", "self={hf}", "the name of the player 'self'"),  # it played the evaluated model itself
    ("opponents", "random={hf}", "the name of the player 'random'"),  # reported as the random player
    ("players", "scripted={hf}", "the name of the player 'scripted'"),
    ("opponents", "pool/3={hf}", "the name of the player 'pool/3'"),
    ("opponents", "={hf}", "an empty name"),
    ("opponents", "{tmp}/random", "the name of the player 'random'"),  # labelled by its folder's name
])
def test_a_model_folder_is_not_labelled_as_another_player(flag, given, said, tmp_path):
    """A model folder's label names its games and weights: "self" would play the evaluated model in its
    place, "random" would report its games as the random player's; both are refused, with a label to use."""
    for folder in (tmp_path / "hf", tmp_path / "random"):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(spec(tmp_path).model.to_hf_dict()))
    suite = "crossplay" if flag == "players" else "games"
    given = given.format(hf=tmp_path / "hf", tmp=tmp_path)
    with pytest.raises(ValueError, match=f"{said}; label it with a name of its own, NAME=path"):
        check_eval_args(spec(tmp_path), args(suite=suite, games=2, **{flag: [given]}))
    check_eval_args(spec(tmp_path), args(suite=suite, games=2, **{flag: [f"other={tmp_path / 'hf'}"]}))


def test_no_opponents_to_play_is_refused_before_the_weights_load(tmp_path):
    """A config evaluated against model players only (eval.opponents=()) gave an empty report and exit
    status 0 when `spiral-jax eval` named no --opponents either."""
    with pytest.raises(ValueError, match="--suite games plays eval.opponents .* lists none; give --opponents"):
        check_eval_args(spec(tmp_path, opponents=()), args(games=2))
    check_eval_args(spec(tmp_path, opponents=()), args(games=2, opponents=["self"]))


def test_crossplay_plays_the_runs_game_unless_told_otherwise(tiny_ctx, tmp_path, monkeypatch):
    """Without --crossplay_env, cross-play plays the first game the run evaluates (a Kuhn run's
    checkpoints played TicTacToe, a game they never learned)."""
    import spiral_jax.run.evaluate as evaluate
    from spiral_jax.cli import FLAGS

    assert FLAGS["crossplay_env"].default == ""  # what the command passes without the flag
    played = []
    monkeypatch.setattr(evaluate, "run_crossplay", lambda ctx, folder, players, env_id, *a: played.append(env_id)
                        or (folder.mkdir(parents=True, exist_ok=True), (folder / "crossplay.md").write_text("")))
    kuhn = spec(tmp_path, env_ids=("KuhnPoker-v1",))
    evaluate.run_eval(tiny_ctx, kuhn, args(suite="crossplay", games=2, opponents=["random"], crossplay_env=""))
    evaluate.run_eval(tiny_ctx, kuhn, args(suite="crossplay", games=2, opponents=["random"]))
    assert played == ["KuhnPoker-v1", "Nim-v0"]
    with pytest.raises(ValueError, match="--crossplay_env: unknown env id"):
        check_eval_args(kuhn, args(suite="crossplay", opponents=["random"], crossplay_env="Nope-v0"))


def test_a_benchmark_downloaded_for_a_gs_out_dir_is_read_from_a_local_file(out, tmp_path, monkeypatch):  # noqa: F811
    """The hub's items are written where `benchmarks.load_items` reads them: beside the reports of a local
    out_dir, in a temporary local folder for a gs:// one (pathlib made gs://b/x the local /gs/b/x)."""
    import sys
    import types

    import spiral_jax.run.evaluate as evaluate
    from spiral_jax.eval import hub
    from spiral_jax.paths import is_remote

    given, local = out
    rows = [{"problem": "1+1?", "answer": "2"}]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: rows))
    targets, read, real = [], [], hub.download

    def download(name, path):
        targets.append(path)
        assert not is_remote(path), f"{path}: hub.download writes a local file"
        return real(name, path)

    monkeypatch.setattr(evaluate.hub, "download", download)
    monkeypatch.setattr(evaluate, "run_benchmarks", lambda ctx, out, files, *a, **k: read.extend(
        item.problem for path in files.values() for item in load_items(path)) or [])
    monkeypatch.setattr(evaluate.benchmarks, "markdown", lambda results: "")
    c = base_config()
    c.out_dir = given
    evaluate.run_eval(None, run_spec(c), args(suite="bench", bench=["MATH500"]), checked=True)
    assert read == ["1+1?"] and len(targets) == 1
    if not is_remote(given):  # kept beside the reports
        assert (local / "eval" / "bench" / "data" / "MATH500.jsonl").is_file()


@pytest.mark.parametrize("flag, suite", [("opponents", "games"), ("players", "crossplay")])
def test_a_model_folder_of_another_architecture_is_refused_before_the_weights_load(flag, suite, tmp_path):
    """Model opponents and cross-play players run in the evaluated model's programs; one of another
    shape is named from its config.json, not after the evaluated weights have loaded."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    with pytest.raises(ValueError, match=rf"--{flag} other=.*another architecture than the evaluated one: "
                                         r"vocab_size 64 \(evaluated: 1024\), hidden_size 32 \(evaluated: 64\)"):
        check_eval_args(spec(tmp_path), args(suite=suite, games=2, **{flag: [f"other={tmp_path / 'hf'}"]}))
