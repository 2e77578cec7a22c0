"""One path layer for every file a run writes: a local folder and a remote URI behave alike.

The remote scheme is gs:// served by a fake fsspec file system that keeps its objects under a local
folder (`bucket`), so the test sees exactly what a bucket would hold, without a network."""
import json

import fsspec
import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem

from spiral_jax.envs import GameRecord, Turn
from spiral_jax.eval import benchmarks
from spiral_jax.eval.transcripts import read_transcripts, write_transcripts
from spiral_jax.metrics import MetricsWriter, read_scalars
from spiral_jax.paths import file_in, is_remote, replace_text, run_path, safe_name, transcript_path
from spiral_jax.rollout import ModelTurn, PlayedGame


class FakeGCS(LocalFileSystem):
    """gs://b/x is the local file <root>/b/x."""

    root = None
    protocol = ("gs", "gcs")

    def __init__(self, *args, **kwargs):
        super().__init__()

    def _strip_protocol(self, path):
        path = str(path)
        for prefix in ("gs://", "gcs://"):
            if path.startswith(prefix):
                return f"{FakeGCS.root}/{path[len(prefix):]}"
        return super()._strip_protocol(path)


@pytest.fixture(params=["local", "gs"])
def out(request, tmp_path, monkeypatch):
    """(the out_dir a run is given, the local folder where its files end up)."""
    if request.param == "local":
        return str(tmp_path / "run"), tmp_path / "run"
    FakeGCS.root = str(tmp_path / "bucket")
    for name in ("gs", "gcs"):
        fsspec.register_implementation(name, FakeGCS, clobber=True)
    from etils.epath import backend
    backend.fsspec_backend._get_filesystem.cache_clear()  # a real gcsfs may have been cached
    monkeypatch.setattr("etils.epath.gpath._is_tf_installed", lambda: False)  # epath's fsspec backend
    return "gs://runs/run", tmp_path / "bucket" / "runs" / "run"


def test_is_remote():
    assert is_remote("gs://b/run") and not is_remote("/tmp/run") and not is_remote("runs/x")


def test_tensorboard_events_reach_the_out_dir(out):
    """Scalars written through MetricsWriter are readable from the folder the run was given, after each
    flush (a remote run uploads its events then) and after close."""
    given, files = out
    writer = MetricsWriter(f"{given}/tensorboard")
    writer.scalars(1, {"train/loss": 0.5})
    writer.flush()
    assert [v for _, v in read_scalars(files / "tensorboard")["train/loss"]] == [0.5]
    writer.scalars(2, {"train/loss": 0.25})
    writer.close()
    assert read_scalars(files / "tensorboard")["train/loss"] == [(1, 0.5), (2, 0.25)]


def test_transcripts_and_reports_reach_the_out_dir(out, tmp_path):
    given, files = out
    game = PlayedGame(GameRecord(0, "KuhnPoker-v2", 7, [Turn(0, "obs", "\\boxed{bet}", "[bet]", True)],
                                 {0: 1.0, 1: -1.0}, "end"), ("model", "random"),
                      [ModelTurn(0, "model", [1], [2, 3], np.zeros(2), "stop")])
    path = write_transcripts(run_path(given) / "eval" / "step0" / "games.jsonl", [game])
    assert read_transcripts(path)[0]["outcomes"] == {"0": "win"}
    assert json.loads((files / "eval" / "step0" / "games.jsonl").read_text())["seed"] == 7
    result = benchmarks.BenchmarkResult("toy", 1, 1, 1.0, (0.2, 1.0), 1.0, 1.0, 3.0, 0.0, {"k": 1})
    benchmarks.write_results([result], f"{given}/eval/step0/math")
    assert json.loads((files / "eval" / "step0" / "math" / "results.json").read_text())[0]["name"] == "toy"
    assert "| toy | 1 |" in (files / "eval" / "step0" / "math" / "results.md").read_text()


def test_summary_is_replaced_whole(out):
    """summary.json is written to a temporary file and moved into place (replace_text): locally and
    remotely, the second version replaces the first and no temporary file is left."""
    given, files = out
    for version in (1, 2):
        replace_text(run_path(given) / "summary.json", json.dumps({"version": version}))
    assert json.loads((files / "summary.json").read_text()) == {"version": 2}
    assert not (files / "summary.json.tmp").exists()


HOSTILE = "openai:m@http://127.0.0.1:1/ok/../../../../escaped/v1"


def test_names_from_user_text_stay_inside_their_folder(out):
    """An opponent spec with "/" and ".." becomes one file name in the folder it is written to: each
    step's transcript is its own file, nothing lands outside out_dir, and plain names stay as they are."""
    given, files = out
    for step in (0, 1):
        path = transcript_path(run_path(given) / "eval" / f"step{step}", "TicTacToe-v0", HOSTILE)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"step {step}")
    written = sorted(p.relative_to(files.parent) for p in files.parent.rglob("*") if p.is_file())
    assert len(written) == 2 and all(p.parts[0] == "run" and len(p.parts) == 4 for p in written), written
    assert [p.parts[2] for p in written] == ["step0", "step1"]
    assert (files / "eval" / "step1" / written[1].name).read_text() == "step 1"
    assert transcript_path(given, "TicTacToe-v0", "random").name == "TicTacToe-v0_vs_random.jsonl"
    # names that had to change keep apart texts that differ only in their unsafe characters
    assert len({safe_name(t) for t in ("a/b", "a_b", "a:b", "a?b", "..", ".", "")}) == 7
    assert all("/" not in safe_name(t) and not safe_name(t).startswith(".") for t in ("..", ".x", "../../etc"))
    assert file_in(given, "../../x", ".jsonl").parent == run_path(given)


def test_a_run_left_in_the_out_dir_is_found_by_its_files(out, monkeypatch):
    """A fresh run refuses an out_dir holding another run's summary or TensorBoard events, in a bucket
    as in a local folder (not only by its checkpoints)."""
    from spiral_jax import checkpoint
    from spiral_jax.run_dir import leftover_run

    given, files = out
    # orbax reads a bucket through Google's client, which the fake bucket does not serve: no checkpoints
    monkeypatch.setattr(checkpoint, "Checkpointer", lambda _: type("None", (), dict(
        latest_step=lambda self: None, close=lambda self: None))())
    assert leftover_run(given) is None
    writer = MetricsWriter(f"{given}/tensorboard")
    writer.scalars(1, {"train/loss": 0.5})
    writer.close()
    replace_text(run_path(given) / "summary.json", "{}\n")
    assert leftover_run(given) == "tensorboard, summary.json"


def test_a_resumed_run_prunes_its_events_in_the_out_dir(out):
    from spiral_jax.metrics import prune_events

    given, files = out
    writer = MetricsWriter(f"{given}/tensorboard")
    for step in (1, 2, 3):
        writer.scalars(step, {"train/loss": float(step)})
    writer.close()
    assert prune_events(f"{given}/tensorboard", lambda tag, step: step > 1) == 2
    assert read_scalars(files / "tensorboard")["train/loss"] == [(1, 1.0)]
