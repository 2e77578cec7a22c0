"""Learning curves read back from event files."""
import pytest

from spiral_jax.metrics import MetricsWriter


def test_learning_curves_png(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is the optional `eval` extra; plots untested")
    from spiral_jax.eval.plots import learning_curves

    writer = MetricsWriter(tmp_path / "tb")
    for step in range(1, 5):
        writer.scalars(step, {"eval/TicTacToe-v0/random/win_rate": step / 10,
                              "eval/KuhnPoker-v1/random/win_rate": 0.5, "train/loss": 1 / step})
    writer.close()
    path = learning_curves(tmp_path / "tb", tmp_path / "curves.png",
                           ["eval/*/win_rate", "train/loss", "nothing/*"])
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="matches"):
        learning_curves(tmp_path / "tb", tmp_path / "none.png", ["nothing/*"])
