"""Commands and tools given a gs:// path: they read and write the bucket, never a local folder named
after the URI (pathlib turns gs://b/x into the local gs:/b/x). The bucket is test_paths' fake one."""
import pytest

from spiral_jax.metrics import MetricsWriter
from tests.test_paths import out  # noqa: F401 (the fixture: local and gs:// out_dirs)


def test_plots_read_and_write_the_out_dir(out, tmp_path, monkeypatch):  # noqa: F811
    pytest.importorskip("matplotlib", reason="matplotlib is the optional `eval` extra; plots untested")
    from spiral_jax.eval.plots import main

    given, files = out
    writer = MetricsWriter(f"{given}/tensorboard")
    for step in (1, 2):
        writer.scalars(step, {"train/loss": 1 / step})
    writer.close()
    monkeypatch.chdir(tmp_path)
    main([given])
    main([given, "--out", f"{given}/plots/loss"])
    assert (files / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert (files / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "gs:").exists()
