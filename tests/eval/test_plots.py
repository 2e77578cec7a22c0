"""Learning curves read back from event files: every logged series shows, none hides another."""
import pytest

from spiral_jax.metrics import MetricsWriter


def test_learning_curves_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the optional `eval` extra; plots untested")
    from spiral_jax.eval.plots import learning_curves, main

    writer = MetricsWriter(tmp_path / "run" / "tensorboard")
    for step in range(1, 5):
        writer.scalars(step, {"eval/TicTacToe-v0/random/win_rate": step / 10,
                              "eval/KuhnPoker-v1/random/win_rate": 0.5, "train/loss": 1 / step,
                              "rollout/TicTacToe-v0/role0/reward": 0.2, "rollout/TicTacToe-v0/role1/reward": -0.2})
    writer.close()
    path = learning_curves(tmp_path / "run" / "tensorboard", tmp_path / "curves.png",
                           ["eval/*/win_rate", "train/loss", "nothing/*"])
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="matches"):
        learning_curves(tmp_path / "run" / "tensorboard", tmp_path / "none.png", ["nothing/*"])
    main([str(tmp_path / "run")])  # the default panels, next to the run
    assert (tmp_path / "run" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_plots_of_a_run_with_nothing_to_draw_say_so(tmp_path, capsys):
    from spiral_jax.eval.plots import main

    MetricsWriter(tmp_path / "new" / "tensorboard").close()  # a run that has not logged a step yet
    for run, said in [(tmp_path / "new", "no scalar in"), (tmp_path / "nope", "is not a folder")]:
        with pytest.raises(SystemExit) as exit_:
            main([str(run)])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_equal_series_are_drawn_once_with_every_label():
    from spiral_jax.eval.plots import series_label, merge_equal

    a, b = [(0, 0.0), (1, 0.0)], [(0, 0.0), (1, 0.5)]
    assert merge_equal({"x/scripted": a, "y/scripted": a, "z/random": b}) == [("x/scripted =\ny/scripted", a),
                                                                            ("z/random", b)]
    assert series_label("eval/TicTacToe-v0/random/win_rate", "eval/*/win_rate") == "TicTacToe-v0/random"
    assert series_label("rollout/Nim-v0/role1/reward", "rollout/*/role*/reward") == "Nim-v0/role1"
    assert series_label("train/loss", "train/loss") == "train/loss"


def test_default_panels_draw_games_rates_apart_from_the_kuhn_estimates():
    from spiral_jax.eval.plots import DEFAULT_PANELS, panel_tags

    tags = ["eval/TicTacToe-v0/random/win_rate", "eval/TicTacToe-v0/random/invalid_rate",
            "eval/TicTacToe-v0/random/seat0/invalid_rate", "eval/Nim-v0/openai:m@http://h/v1/invalid_rate",
            "eval/kuhn/invalid_rate", "eval/kuhn/exploitability", "train/loss"]
    panels = dict(panel_tags(tags, DEFAULT_PANELS))
    assert panels["eval/*/*/invalid_rate"] == ["eval/Nim-v0/openai:m@http://h/v1/invalid_rate",
                                               "eval/TicTacToe-v0/random/invalid_rate"]
    assert panels["eval/kuhn/exploitability"] == ["eval/kuhn/exploitability"] and "eval/*/*/win_rate" in panels


def test_plots_out_is_the_file_it_says_it_wrote(tmp_path, capsys):
    """--out a folder writes curves.png in it, a name without a suffix gets .png (matplotlib adds it),
    and a path under a file is one line, not a traceback."""
    pytest.importorskip("matplotlib", reason="matplotlib is the optional `eval` extra; plots untested")
    from spiral_jax.eval.plots import main

    writer = MetricsWriter(tmp_path / "run" / "tensorboard")
    writer.scalars(1, {"train/loss": 1.0})
    writer.close()
    (tmp_path / "figs").mkdir()
    (tmp_path / "a file").write_text("")
    for out, wrote in [(tmp_path / "figs", tmp_path / "figs" / "curves.png"), (tmp_path / "c ü", tmp_path / "c ü.png")]:
        main([str(tmp_path / "run"), "--out", str(out)])
        assert capsys.readouterr().out == f"wrote {wrote}\n" and wrote.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "run"), "--out", str(tmp_path / "a file" / "c.png")])
    assert exit_.value.code == 2 and "plots: cannot write" in capsys.readouterr().err
