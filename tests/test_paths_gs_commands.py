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


def test_export_to_a_uri_is_refused_before_the_weights_load(tmp_path, capsys, monkeypatch):
    """export writes local files (safetensors, the tokenizer through transformers): --out gs://... is one
    line naming the local export and the copy to make, and no local folder named gs: appears."""
    import spiral_jax.run.build
    from spiral_jax.cli import main
    from tests.test_cli import TINY

    monkeypatch.setattr(spiral_jax.run.build, "load_policy", lambda *a, **k: pytest.fail("the weights loaded"))
    monkeypatch.chdir(tmp_path)
    assert main(["spiral-jax", "export", f"--config={TINY}", f"--config.out_dir={tmp_path / 'run'}",
                 "--out=gs://models/exported"]) == 1
    err = capsys.readouterr().err.strip()
    assert "--out gs://models/exported: export writes a local folder" in err and "\n" not in err, err
    assert "gcloud storage rsync -r exported/NAME gs://models/exported" in err
    assert not (tmp_path / "gs:").exists()


def test_benchmark_and_example_files_are_read_from_the_bucket(out, tmp_path):  # noqa: F811
    """--bench NAME=gs://..., eval.math.files and --shots_file in a bucket are read from there, as local
    files are (pathlib said a file in the bucket did not exist)."""
    from spiral_jax.config import base_config
    from spiral_jax.eval.benchmarks import load_items, local_files
    from spiral_jax.paths import run_path
    from spiral_jax.run.evaluate import check_eval_args
    from spiral_jax.run.setup import run_spec
    from tests.eval.test_eval_checks import args

    given, files = out
    items = run_path(given) / "data" / "toy.jsonl"
    items.parent.mkdir(parents=True, exist_ok=True)
    items.write_text('\ufeff{"problem": "1+1", "answer": "2", "solution": "1+1=2"}\n{"problem": "2+2", "answer": "4"}\n')
    assert (files / "data" / "toy.jsonl").is_file()
    assert local_files([str(items), f"mine={items}"]) == {"toy": str(items), "mine": str(items)}
    assert [i.answer for i in load_items(str(items))] == ["2", "4"]
    c = base_config()
    c.out_dir = str(tmp_path / "run")
    check_eval_args(run_spec(c), args(suite="bench", bench=[str(items)], shots_file=str(items), shots=2))
    with pytest.raises(FileNotFoundError, match="no such file"):
        local_files([f"toy={given}/data/none.jsonl"])


@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("out_dir", ["gcs://runs/run", "https://host/run"])
def test_an_out_dir_of_a_scheme_with_no_file_system_is_one_line(command, out_dir, tmp_path, capsys, monkeypatch):
    """gcsfs's alias gcs:// and https:// are no schemes epath serves: the command names the URI and
    gs://, and does not end in a KeyError traceback."""
    import spiral_jax.run
    from spiral_jax.cli import main
    from spiral_jax.paths import run_path
    from tests.test_cli import TINY

    monkeypatch.setattr(spiral_jax.run, "Trainer", lambda *a, **k: pytest.fail("training started"))
    monkeypatch.chdir(tmp_path)
    assert main(["spiral-jax", command, f"--config={TINY}", f"--config.out_dir={out_dir}"]) == 1
    err = capsys.readouterr().err.strip()
    scheme = out_dir.split(":")[0]
    assert f"{out_dir}/checkpoints: a {scheme}:// URI is not a place spiral-jax reads or writes files" in err, err
    assert "gs://BUCKET/PATH" in err and "\n" not in err
    with pytest.raises(ValueError, match="give a local path or a Cloud Storage one"):
        run_path(f"{out_dir}/eval/games")


def test_resume_without_a_checkpoint_in_the_out_dir_fails_before_the_model_is_built(out, capsys, monkeypatch):  # noqa: F811
    """train --resume on an out_dir with no checkpoint is refused before any weights load, in a bucket
    as in a local folder (a bucket's run built its model first, then found nothing to restore)."""
    import spiral_jax.run
    from spiral_jax import checkpoint
    from spiral_jax.cli import main
    from tests.test_cli import TINY

    given, files = out

    class Started(Exception):
        pass

    def trainer(*args, **kwargs):
        raise Started

    # orbax reads a bucket through Google's client, which the fake bucket does not serve: a step is a folder
    monkeypatch.setattr(checkpoint, "Checkpointer", lambda _: type("Steps", (), dict(
        latest_step=lambda self: 5 if (files / "checkpoints" / "5").is_dir() else None,
        close=lambda self: None))())
    monkeypatch.setattr(spiral_jax.run, "Trainer", trainer)
    command = ["spiral-jax", "train", f"--config={TINY}", f"--config.out_dir={given}", "--resume"]
    assert main(command) == 1
    assert capsys.readouterr().err.strip() == (
        f"spiral-jax train: RunDirError: no checkpoint to resume from in {given}/checkpoints; leave out --resume "
        f"to start a new run, or give the run's folder as --config.out_dir")
    (files / "checkpoints" / "5").mkdir(parents=True)
    with pytest.raises(Started):
        main(command)


@pytest.mark.parametrize("command, extra, what", [
    ("train", ["--config.model.path=gs://models/Qwen3"], "model.path"),
    ("train", ["--config.rollout.mode=fixed_opponent", "--config.rollout.opponent=gs://models/Qwen3"],
     "rollout.opponent"),
    ("eval", ["--config.tokenizer.path=gs://models/Qwen3"], "the tokenizer folder (tokenizer.path, else model.path)"),
    ("eval", ["--opponents=other=gs://models/Qwen3"], "--opponents other=gs://models/Qwen3"),
    ("eval", ["--suite=crossplay", "--players=other=gs://models/Qwen3"], "--players other=gs://models/Qwen3"),
])
def test_a_model_folder_in_a_bucket_names_the_local_copy_to_make(command, extra, what, tmp_path, capsys, monkeypatch):
    """Weights and tokenizers load from local files: a gs:// model folder is one line that says so and
    how to copy it (it said the folder did not exist, or showed it as the local gs:/models/...)."""
    import spiral_jax.run
    import spiral_jax.run.build
    from spiral_jax.cli import main
    from tests.test_cli import TINY

    monkeypatch.setattr(spiral_jax.run, "Trainer", lambda *a, **k: pytest.fail("training started"))
    monkeypatch.setattr(spiral_jax.run.build, "load_policy", lambda *a, **k: pytest.fail("the weights loaded"))
    assert main(["spiral-jax", command, f"--config={TINY}", f"--config.out_dir={tmp_path / 'run'}", *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert f"{what}: gs://models/Qwen3 is a URI, and weights and tokenizers load from a local folder; copy it to " \
           f"one (gcloud storage rsync -r gs://models/Qwen3 /ckpt/NAME)" in err and "\n" not in err, err


def test_an_unreadable_checkpoint_in_a_bucket_is_said_to_stay_where_it_is():
    """A resumed run passes over an unreadable step: locally it is renamed <step>.unreadable; in a bucket
    (no rename) it stays, and the line says so rather than naming a folder that was never made."""
    from spiral_jax.checkpoint import Checkpointer

    ckpt = Checkpointer.__new__(Checkpointer)  # orbax does not serve the fake bucket: its steps are given
    ckpt.directory = "gs://runs/run/checkpoints"
    ckpt._manager = type("Manager", (), dict(all_steps=lambda self: [1, 2], reload=lambda self: None))()
    said = []

    def restore(step):
        if step == 2:
            raise ValueError("a truncated manifest")
        return "step 1"

    assert ckpt._newest_readable(restore, said.append, set_aside=True) == "step 1"
    assert said[0].startswith("checkpoint step 2 in gs://runs/run/checkpoints cannot be read (")
    assert said[0].endswith("; left where it is (a bucket has no rename; a later save of that step replaces it); "
                            "trying step 1"), said
