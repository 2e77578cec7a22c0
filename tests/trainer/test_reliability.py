"""Runs never mix or lose work: the out_dir claim, damaged checkpoints, preemption in the bootstrap,
safe export, clear errors for config files, prompts, tokenizers and diverging updates."""
import asyncio
import errno
import gc
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from spiral_jax.cli import main as cli_main
from spiral_jax.models import CheckpointError
from spiral_jax.rollout import ModelTurn, PlayedGame
from spiral_jax.run import PREEMPTED_EXIT_CODE, Trainer, TrainingDiverged
from spiral_jax.run_dir import leftover_run
from spiral_jax.envs import GameRecord, Turn
from tests.tiny_models import jit_forward
from tests.trainer.test_trainer import REPO, _config_file, tiny_config


def _train(config, *extra):
    return cli_main(["spiral-jax", "train", f"--config={config}", *extra])


def _params(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(trainer.state.train.params))]


# ------------------------------------------------------------------------------- the out_dir claim

def test_fresh_run_refuses_an_out_dir_with_another_run(tmp_path, capsys):
    config = _config_file(tmp_path, **{"train.steps": 1})
    # A --resume with nothing to resume (a scheduler's first attempt) writes nothing a run would refuse.
    assert _train(config, "--resume") == 1
    assert "no checkpoint to resume from" in capsys.readouterr().err
    assert leftover_run(str(tmp_path / "run")) is None
    assert _train(config) == 0
    checkpoints = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
    out = capsys.readouterr().out
    assert "devices: 8 x cpu" in out and "parameters (random init)" in out and "tensorboard --logdir" in out
    assert f"done: outputs are in {tmp_path / 'run'}" in out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["train"]["steps"] == 1
    assert _train(config) == 1
    err = capsys.readouterr().err
    assert "already holds a run (checkpoints up to step 1" in err and "--resume" in err and "--overwrite" in err
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == checkpoints  # nothing touched
    assert not (tmp_path / "run" / "run.lock").exists()  # the refusing run released its lock
    assert _train(config, "--resume", "--overwrite") == 2  # a bad command line, said before any setup
    assert "pass one" in capsys.readouterr().err
    (tmp_path / "run" / "tensorboard" / "old_marker").write_text("old run")
    assert _train(config, "--overwrite") == 0
    assert "deleted the previous run" in capsys.readouterr().out
    assert not (tmp_path / "run" / "tensorboard" / "old_marker").exists()


def test_a_second_run_on_a_locked_out_dir_refuses_and_a_stale_lock_is_taken_over(tmp_path, capsys):
    config = _config_file(tmp_path, **{"train.steps": 1})
    (tmp_path / "run").mkdir()
    lock = tmp_path / "run" / "run.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"pid": holder.pid, "host": os.uname().nodename, "started": "earlier"}))
        assert _train(config) == 1
        err = capsys.readouterr().err
        assert f"in use by process {holder.pid} on this host (started earlier)" in err
    finally:
        holder.kill()
        holder.wait()
    assert _train(config) == 0  # the holder is gone: its lock is stale
    assert f"stale lock of process {holder.pid}" in capsys.readouterr().out
    assert not lock.exists()
    lock.write_text(json.dumps({"pid": 1, "host": "another-host", "started": "earlier"}))
    assert _train(config, "--resume") == 1
    assert "in use by process 1 on host another-host" in capsys.readouterr().err


# ----------------------------------------------------------------------------- damaged checkpoints

def test_resume_falls_back_past_a_truncated_checkpoint(tmp_path, monkeypatch):
    Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 2, "train.checkpoint_every": 1}), log=lambda *_: None).run()
    step2 = tmp_path / "run" / "checkpoints" / "2"
    for data in [p for p in (step2 / "state").rglob("*") if p.is_file()]:  # every file of the state, cut short
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 2)
    lines, unraisable = [], []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # the failed read's coroutines end quietly
    resumed = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 3, "train.checkpoint_every": 1}), resume=True,
                      log=lines.append)
    assert resumed.state.step == 1
    assert any("checkpoint step 2" in line and "cannot be read" in line for line in lines)
    assert any("resuming from step 1" in line for line in lines)
    assert (tmp_path / "run" / "checkpoints" / "2.unreadable").is_dir()
    assert any("removed" in line and "TensorBoard value(s) logged past the checkpoint" in line for line in lines)
    resumed.run()  # writes step 2 again, then 3
    assert resumed.ckpt.latest_step() == 3
    from spiral_jax.metrics import read_scalars
    steps = [s for s, _ in read_scalars(tmp_path / "run" / "tensorboard")["train/loss"]]
    assert steps == sorted(set(steps)) and steps[-1] == 3  # step 2 once: the stopped run's was removed
    del resumed  # what held the failed read's coroutines
    gc.collect()
    assert not unraisable, [f"{u.exc_value!r:.200}" for u in unraisable[:3]]


def test_asyncio_says_nothing_of_orbax_reads_left_failed_and_all_else_as_before(caplog):
    """A restore that fails leaves orbax's other read tasks failed, and asyncio logs each as it is
    collected ("Task exception was never retrieved", with a traceback). Those of orbax's reads are
    dropped once a fallback has begun; anything else asyncio says still comes through."""
    from spiral_jax import checkpoint

    def failed_task_of(filename):
        code = compile("async def read():\n    raise ValueError('DATA_LOSS')\n", filename, "exec")
        namespace = {}
        exec(code, namespace)
        loop = asyncio.new_event_loop()
        task = loop.create_task(namespace["read"]())
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()
        del task
        gc.collect()

    checkpoint._drop_closed_loop_noise()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        failed_task_of("/site-packages/orbax/checkpoint/_src/serialization/serialization.py")
        failed_task_of("/site-packages/elsewhere/reads.py")
    logged = [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    assert len(logged) == 1 and "elsewhere/reads.py" in logged[0], logged


def test_the_fallback_past_a_damaged_checkpoint_is_one_line_without_tracebacks(tmp_path):
    """`train --resume` in a fresh process past a cut-off tensorstore manifest: the restore fails while
    reads are in flight, whose late errors ("Event loop is closed") Python would print as tracebacks.
    The step is one line with a short reason; nothing else is said about it."""
    Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 2, "train.checkpoint_every": 1}), log=lambda *_: None).run()
    manifest = tmp_path / "run" / "checkpoints" / "2" / "state" / "manifest.ocdbt"
    manifest.write_bytes(manifest.read_bytes()[: manifest.stat().st_size // 2])
    config = tmp_path / "cfg.py"
    config.write_text("from tests.trainer.test_trainer import tiny_config\nfrom pathlib import Path\n"
                      f"def get_config():\n    return tiny_config(Path({str(tmp_path)!r}), **{{'train.steps': 1, "
                      "'eval.opponents': (), 'eval.kuhn_samples': -1})\n")
    cli = "import sys; from spiral_jax.cli import main; sys.exit(main())"
    done = subprocess.run([sys.executable, "-c", cli, "train", f"--config={config}", "--resume"], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    failed = [line for line in said.splitlines() if "checkpoint step 2" in line]
    assert len(failed) == 1 and "Traceback" not in said and "Event loop is closed" not in said, said[-3000:]
    assert "cannot be read (DATA_LOSS" in failed[0] and "TensorStore details" not in failed[0]
    assert failed[0].endswith("set aside as 2.unreadable; trying step 1") and "resumed from" in said


def test_no_readable_checkpoint_is_a_clear_error(tmp_path):
    Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 1}), log=lambda *_: None).run()
    for p in (tmp_path / "run" / "checkpoints" / "1" / "state").rglob("*"):
        if p.is_file() and p.stat().st_size > 100:
            p.write_bytes(b"")
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be read: step 1"):
        Trainer.from_config(tiny_config(tmp_path), resume=True, log=lambda *_: None)


# ------------------------------------------------------------------------------------ preemption

def _bootstrap_config(tmp_path, **changes):
    return tiny_config(tmp_path, **{"bootstrap.enabled": True, "bootstrap.steps": 6, "bootstrap.batch_size": 8,
                                    "train.steps": 1, "eval.opponents": ("random",), **changes})


def test_a_stop_in_the_bootstrap_saves_it_and_the_resumed_run_is_exact(tmp_path):
    full = Trainer.from_config(_bootstrap_config(tmp_path / "a"), log=lambda *_: None)
    full.run()
    stopped = Trainer.from_config(_bootstrap_config(tmp_path / "b"), log=lambda *_: None)
    update_calls = []
    from spiral_jax.run import imitation as stage
    imitation = stage.imitation_samples

    def samples_then_signal(*args, **kwargs):
        update_calls.append(1)
        if len(update_calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return imitation(*args, **kwargs)

    stage.imitation_samples = samples_then_signal
    try:
        assert stopped.run() == {} and stopped.stopped
    finally:
        stage.imitation_samples = imitation
    assert stopped.state.bootstrap_step == 3 and stopped.ckpt.latest_step() == 0
    before = stopped.state.wall_time_s  # the stopped process's time, kept in its checkpoint
    assert before > 0
    start = time.perf_counter()
    resumed = Trainer.from_config(_bootstrap_config(tmp_path / "b"), resume=True, log=lambda *_: None)
    assert resumed.state.bootstrap_step == 3 and resumed.state.wall_time_s == before
    resumed.run()
    # The run's wall time counts both processes, not the resumed one's alone.
    wall = json.loads((tmp_path / "b" / "run" / "summary.json").read_text())["wall_time_s"]
    assert before + time.perf_counter() - start + 0.1 >= wall >= before + 0.9 * (time.perf_counter() - start) - 0.1
    for a, b in zip(_params(full), _params(resumed)):
        np.testing.assert_array_equal(a, b)
    again = Trainer.from_config(_bootstrap_config(tmp_path / "b", **{"train.steps": 2}), resume=True, log=lambda *_: None)
    assert again.state.phase == "rl" and again.state.step == 1  # the finished bootstrap is not redone


def _train_until_bootstrap_step(config, step: int, *extra) -> tuple[int, str]:
    """Run `spiral-jax train` in a process of its own, send SIGTERM once the bootstrap's progress bar
    passes `step`: (exit status, everything it printed)."""
    env = dict(os.environ, PYTHONPATH=REPO)  # the tests' XLA flags: 8 devices, quick compiles
    cli = "import sys; from spiral_jax.cli import main; sys.exit(main())"
    proc = subprocess.Popen([sys.executable, "-c", cli, "train", f"--config={config}", *extra], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    for line in iter(proc.stdout.readline, ""):  # text mode splits tqdm's \r updates into lines
        seen += line
        done = re.search(r"bootstrap:.*\| *(\d+)/100000", line)
        if done and int(done.group(1)) >= step:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, seen + out


def _bootstrap_meta(tmp_path) -> dict:
    return json.loads(next((tmp_path / "run" / "checkpoints" / "0").rglob("meta/metadata")).read_text())


@pytest.mark.slow
def test_sigterm_during_the_bootstrap_exits_75_and_resume_continues_from_its_step(tmp_path):
    """A real SIGTERM in the bootstrap saves it part-way (exit 75); `train --resume` continues from the
    saved bootstrap step, not from step 0, and a second SIGTERM saves a later step."""
    config = tmp_path / "cfg.py"
    config.write_text(
        "from tests.trainer.test_trainer import tiny_config\nfrom pathlib import Path\n"
        "def get_config():\n"
        f"    return tiny_config(Path({str(tmp_path)!r}), **{{'bootstrap.enabled': True, "
        "'bootstrap.steps': 100000, 'bootstrap.batch_size': 8})\n")
    status, seen = _train_until_bootstrap_step(config, 5)
    assert status == PREEMPTED_EXIT_CODE, seen[-2000:]
    assert "stopped at bootstrap step" in seen and "resume with --resume" in seen
    meta = _bootstrap_meta(tmp_path)
    saved = meta["bootstrap_step"]
    assert meta["phase"] == "bootstrap" and 5 <= saved < 100000
    status, seen = _train_until_bootstrap_step(config, saved + 5, "--resume")
    assert status == PREEMPTED_EXIT_CODE, seen[-2000:]
    assert f"in the bootstrap, after {saved} of 100000 steps" in seen
    counts = [int(n) for n in re.findall(r"bootstrap:.*?\| *(\d+)/100000", seen)]
    assert counts and min(counts) == saved, counts[:5]  # the bar starts at the saved step
    assert _bootstrap_meta(tmp_path)["bootstrap_step"] >= saved + 5


def test_updates_skipped_in_a_row_stop_the_run(tmp_path):
    lines = []
    trainer = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 10, "train.max_skipped_in_a_row": 2}),
                      log=lines.append)
    step = trainer.train_step

    def skipped_step():
        metrics = step()
        return {**metrics, "train/skipped": 1.0, "train/skipped_total": float(trainer.state.step)}

    trainer.train_step = skipped_step
    with pytest.raises(TrainingDiverged, match="2 updates in a row were skipped.*--resume"):
        trainer.run()
    assert sum("update skipped" in line for line in lines) == 2


# ------------------------------------------------------------------------------------------- export

def test_export_refuses_a_non_empty_folder_and_overwrites_cleanly(tmp_path, capsys, monkeypatch):
    """A folder no export wrote is never cleared; --overwrite of an earlier export deletes what that
    export listed in export_manifest.json (a stale shard too) and keeps anything else."""
    config = _config_file(tmp_path, **{"train.steps": 1})
    assert _train(config) == 0
    out = tmp_path / "exported"
    out.mkdir()
    (out / "config.json").write_text('{"mine": true}')
    export = ["spiral-jax", "export", f"--config={config}", f"--out={out}"]
    assert cli_main(export) == 1
    assert "is not empty" in capsys.readouterr().err and (out / "config.json").read_text() == '{"mine": true}'
    assert cli_main([*export, "--overwrite"]) == 1
    assert "holds no export_manifest.json" in capsys.readouterr().err
    assert (out / "config.json").read_text() == '{"mine": true}'
    (out / "config.json").unlink()
    assert cli_main(export) == 0
    manifest = json.loads((out / "export_manifest.json").read_text())
    assert "config.json" in manifest["entries"] and "model.safetensors" in manifest["entries"]
    (out / "model-00002-of-00002.safetensors").write_text("a shard of an earlier, larger export")
    (out / "export_manifest.json").write_text(json.dumps({"entries": [*manifest["entries"],
                                                                      "model-00002-of-00002.safetensors"]}))
    (out / "notes.txt").write_text("mine")
    assert cli_main([*export, "--overwrite"]) == 0
    assert not (out / "model-00002-of-00002.safetensors").exists() and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir() if p.name != "notes.txt"} == {"0o644"}
    assert "notes.txt" not in json.loads((out / "export_manifest.json").read_text())["entries"]
    # An earlier export that is the run's model.path: --overwrite would delete what the export reads.
    assert cli_main([*export, "--overwrite", f"--config.model.path={out}"]) == 1
    assert "is model.path, a folder the export reads" in capsys.readouterr().err
    assert (out / "model.safetensors").is_file()
    # An export that fails part-way (the disk fills while the tokenizer is copied) lists what it wrote,
    # so that --overwrite clears it once there is room.
    partial = tmp_path / "partial"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr("spiral_jax.export.shutil.copy", full_disk)
    assert cli_main([*export[:3], f"--out={partial}"]) == 1
    err = capsys.readouterr().err
    assert "the disk is full" in err and "with --overwrite, which clears what this export wrote" in err, err
    assert "model.safetensors" in json.loads((partial / "export_manifest.json").read_text())["entries"]
    monkeypatch.undo()
    assert cli_main([*export[:3], f"--out={partial}", "--overwrite"]) == 0
    listed = json.loads((partial / "export_manifest.json").read_text())["entries"]
    assert sorted(os.listdir(partial)) == sorted([*listed, "export_manifest.json"]) and "tokenizer.json" in listed
    # A shell leaves --out=~/x as written: it means the home folder's x, not a folder named ~ here.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert cli_main([*export[:3], "--out=~/hf"]) == 0
    assert (tmp_path / "home" / "hf" / "config.json").is_file() and not (tmp_path / "~").exists()


# ------------------------------------------------------------------------------------ clear errors

@pytest.mark.parametrize("body, expected", [
    ("from spiral_jax.config import base_config\ndef get_config()\n    return base_config()\n",
     r"cfg\.py, line 2: expected ':'"),
    ("from spiral_jax.config import base_config\ndef make():\n    return base_config()\n",
     r"defines no get_config\(\) function"),
    ("from spiral_jax.config import base_config\ndef get_config():\n    c = base_config()\n"
     "    c.train.stepz = 3\n    return c\n",
     r"cfg\.py, line 4 \(c\.train\.stepz = 3\).*Did you mean \"steps\" instead of \"stepz\""),
])
def test_config_file_errors_name_the_file_line_and_problem(tmp_path, capsys, body, expected):
    config = tmp_path / "cfg.py"
    config.write_text(body)
    assert _train(config, "--config.train.steps=3") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "\\'" not in err, err  # the message as written, not its repr
    import re
    assert re.search(expected, err), err


def test_prompts_longer_than_max_prompt_len_fail_in_the_first_round(tmp_path):
    trainer = Trainer.from_config(tiny_config(tmp_path, **{"rollout.max_prompt_len": 32}), log=lambda *_: None)
    with pytest.raises(ValueError, match=r"longer than rollout.max_prompt_len=32 tokens \(the shortest has \d+\)"):
        trainer.collect(trainer.to_sampler(trainer.state.train.params))


def test_all_zero_game_weights_are_an_error(tmp_path):
    with pytest.raises(ValueError, match="games.weights=.*positive sum"):
        Trainer.from_config(tiny_config(tmp_path, **{"games.weights": (0.0,)}))


def test_a_tokenizer_far_smaller_than_the_model_or_without_the_template_tokens(tmp_path):
    from spiral_jax.templates import Template
    from spiral_jax.tokenizer import check_template_tokens

    c = tiny_config(tmp_path)
    c.model.random.vocab_size = 8192
    with pytest.raises(CheckpointError, match="2048 tokens but the model's embedding has 8192 rows"):
        Trainer.from_config(c)

    class NoChatTokens:
        chat_template = None

        def get_vocab(self):
            return {"a": 0, "<|endoftext|>": 1}

    with pytest.raises(CheckpointError, match="<\\|im_start\\|> and <\\|im_end\\|>.*tokenizer.template='chat'"):
        check_template_tokens(NoChatTokens(), Template("qwen_raw"), "here")
    with pytest.raises(CheckpointError, match="needs a tokenizer with a chat_template"):
        check_template_tokens(NoChatTokens(), Template("chat"), "here")
    check_template_tokens(NoChatTokens(), Template("plain"), "here")


def test_games_cross_hosts_as_plain_json_exactly():
    logprobs = np.asarray([-0.1234567, -3.3e-8, -17.25], np.float32)
    game = PlayedGame(GameRecord(3, "TicTacToe-v0", 11, [Turn(0, "obs", "\\boxed{4}", "4", True)],
                                 {0: 1.0, 1: -1.0}, "win", False),
                      ("model", "pool/3"), [ModelTurn(0, "model", [1, 2], [5, 6, 2], logprobs, "stop")])
    back = PlayedGame.from_plain(json.loads(json.dumps(game.to_plain())))
    assert back.record == game.record and back.seats == game.seats
    np.testing.assert_array_equal(back.model_turns[0].logprobs, logprobs)
    assert back.model_turns[0].logprobs.dtype == np.float32
    assert back.model_turns[0].response_ids == [5, 6, 2]


# --------------------------------------------------------------------------------------- eval CLI

def test_eval_reads_the_newest_checkpoint_or_says_there_is_nothing(tmp_path, capsys):
    config = _config_file(tmp_path, **{"train.steps": 2, "train.checkpoint_every": 1})
    assert cli_main(["spiral-jax", "eval", f"--config={config}", "--games=2"]) == 1
    assert "nothing to eval: no checkpoint in" in capsys.readouterr().err
    assert _train(config) == 0
    capsys.readouterr()
    report = tmp_path / "report"
    assert cli_main(["spiral-jax", "eval", f"--config={config}", "--games=2", f"--eval_out={report}",
                     "--opponents=random"]) == 0
    assert "[eval] the checkpoint of step 2 in" in capsys.readouterr().err
    games = json.loads((report / "games.json").read_text())  # --eval_out is the report folder itself
    assert [(r["env_id"], r["opponent"], r["games"]) for r in games["results"]] == [("TicTacToe-v0", "random", 2)]
    exported = tmp_path / "exported"
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={exported}"]) == 0
    assert cli_main(["spiral-jax", "eval", f"--config={config}", "--games=2", f"--eval_out={report}",
                     f"--config.model.path={exported}", f"--config.out_dir={tmp_path / 'elsewhere'}",
                     "--opponents=random"]) == 0
    assert f"[eval] the weights at model.path={exported}" in capsys.readouterr().err


@pytest.mark.slow
def test_bf16_sharded_export_loads_in_transformers(tmp_path):
    import ml_dtypes
    import torch
    import transformers

    from spiral_jax.models import load_pretrained

    config = _config_file(tmp_path, **{"train.steps": 1})
    assert _train(config) == 0
    out = tmp_path / "exported"
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={out}", "--dtype=bfloat16",
                     "--max_shard_gib=0.00005"]) == 0  # 52 KiB shards: several files and an index
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out / s).is_file() for s in shards) and not (out / "model.safetensors").exists()
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert 2 in json.loads((out / "generation_config.json").read_text())["eos_token_id"]  # <|im_end|>
    assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o644"}

    trainer = Trainer.from_config(tiny_config(tmp_path), resume=True, log=lambda *_: None)
    ours = jax.device_get(trainer.state.train.params)
    cfg, reloaded = load_pretrained(out)  # our own loader reads the shards: the weights rounded to bf16
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(jax.device_get(reloaded))):
        np.testing.assert_array_equal(np.asarray(a).astype(ml_dtypes.bfloat16).astype(np.float32), b)
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.asarray([transformers.AutoTokenizer.from_pretrained(out).encode("Free cells: [0], [4]. \\boxed{4}")])
    with torch.no_grad():
        theirs = model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, np.asarray(jit_forward(reloaded, cfg, ids)), atol=1e-4)  # same bf16 weights
    full = np.asarray(jit_forward(trainer.state.train.params, trainer.cfg, ids))
    assert np.abs(theirs - full).max() < 0.05  # bf16 storage: each weight off by at most 2^-9 relative


# --------------------------------------------------------------------------- async checkpointing

def _async_config(tmp_path, **changes):
    return tiny_config(tmp_path, **{"train.async_checkpointing": True, "train.checkpoint_every": 1,
                                    "eval.opponents": ("random",), **changes})


def test_a_signal_during_an_async_save_keeps_the_checkpoint_whole(tmp_path):
    """SIGTERM arrives while the step-2 checkpoint is still being written in the background: the run
    waits for it, stops, and the resumed run ends where an uninterrupted one does."""
    full = Trainer.from_config(_async_config(tmp_path / "a", **{"train.steps": 3}), log=lambda *_: None)
    full.run()
    trainer = Trainer.from_config(_async_config(tmp_path / "b", **{"train.steps": 3}), log=lambda *_: None)
    save = trainer.ckpt.save

    def save_then_signal(step, *args, **kwargs):
        save(step, *args, **kwargs)
        if step == 2:
            assert trainer.ckpt.saving() or trainer.ckpt.latest_step() == 2
            os.kill(os.getpid(), signal.SIGTERM)

    trainer.ckpt.save = save_then_signal
    assert trainer.run() == {} and trainer.stopped and trainer.state.step == 2
    resumed = Trainer.from_config(_async_config(tmp_path / "b", **{"train.steps": 3}), resume=True, log=lambda *_: None)
    assert resumed.state.step == 2
    resumed.run()
    for a, b in zip(_params(full), _params(resumed)):
        np.testing.assert_array_equal(a, b)


def test_resume_replaces_a_checkpoint_left_incomplete(tmp_path):
    """A save cut off by a crash leaves orbax's temporary folder for that step; the resumed run writes
    the step again and it restores."""
    import shutil

    Trainer.from_config(_async_config(tmp_path, **{"train.steps": 2}), log=lambda *_: None).run()
    checkpoints = tmp_path / "run" / "checkpoints"
    shutil.copytree(checkpoints / "2", checkpoints / "3.orbax-checkpoint-tmp-1234")  # a step-3 save, cut off
    resumed = Trainer.from_config(_async_config(tmp_path, **{"train.steps": 3}), resume=True, log=lambda *_: None)
    assert resumed.state.step == 2
    resumed.run()
    again = Trainer.from_config(_async_config(tmp_path, **{"train.steps": 3}), resume=True, log=lambda *_: None)
    assert again.state.step == 3 and again.ckpt.latest_step() == 3
    for a, b in zip(_params(resumed), _params(again)):  # step 3 is the new save, not the leftover
        np.testing.assert_array_equal(a, b)


def test_an_async_save_that_fails_in_the_background_is_reported_with_the_step_to_resume_from(tmp_path):
    """The save call returns; the write behind it fails later (here: a file-size limit makes the
    array's file unwritable, as a full or failing disk would). The next wait says which step is lost
    and which complete one a resumed run starts from; the failed step is not taken for a checkpoint."""
    import resource

    import jax.numpy as jnp

    from spiral_jax.checkpoint import Checkpointer

    state = {"w": jnp.arange(256 * 1024, dtype=jnp.float32).reshape(256, 1024)}  # a 1 MiB file
    meta = dict(step=0, rae={}, pool_steps=[])
    ckpt = Checkpointer(tmp_path / "checkpoints", async_save=True)
    ckpt.save(1, state, [], meta)
    ckpt.wait()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
    try:
        ckpt.save(2, jax.tree.map(lambda x: x + 1, state), [], meta)  # returns; the write goes on behind it
        with pytest.raises(CheckpointError, match="step 2 could not be written in the background .*"
                                                  "newest complete checkpoint is step 1.*--resume"):
            ckpt.wait()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    ckpt.close()
    again = Checkpointer(tmp_path / "checkpoints", async_save=True)
    assert again.latest_step() == 1
    restored, _, _ = again.restore(None, state, None)
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(state["w"]))
