"""The command line: help for every command, flags checked per command, the resolved config."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from spiral_jax.cli import COMMANDS, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "tiny_tictactoe.py")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help_listing_its_flags(command, flag, capsys):
    assert main(["spiral-jax", command, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: spiral-jax {command} --config FILE")
    for name in COMMANDS[command][1]:
        assert f"--{name}" in out
    others = set().union(*(names for _, names in COMMANDS.values())) - set(COMMANDS[command][1])
    assert not any(f"--{name}\n" in out or f"--{name}=" in out for name in others)


def test_top_level_help(capsys):
    assert main(["spiral-jax", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"spiral-jax {c}" in out for c in COMMANDS)
    first = out.splitlines()[0]  # it named train, eval, export and plan only
    assert all(c in first for c in [*COMMANDS, "launch"]), first
    assert main(["spiral-jax"]) == 2


def test_help_shows_no_default_that_its_text_already_says(capsys):
    """--step's default -1 means the newest checkpoint, which its text says: "(default: -1)" after it
    contradicted it. API opponents are among the --opponents a user can give."""
    assert main(["spiral-jax", "eval", "--help"]) == 0
    out = capsys.readouterr().out
    assert "(default: -1)" not in out and "(default: the newest)" in out
    assert "openai:MODEL@URL" in out.split("--opponents=")[1].split("--env_ids")[0]
    assert "(default eval.env_ids, else games.env_ids)" in out  # as the suite reads them (it named games.env_ids)
    assert "<config|reference>" in out  # the config's own settings have a name (it printed <|reference>)
    assert "(default: 8000)" in (main(["spiral-jax", "serve", "--help"]), capsys.readouterr().out)[1]


def test_a_command_rejects_another_commands_flags(capsys):
    assert main(["spiral-jax", "plan", f"--config={TINY}", "--games", "5", "--suite", "kuhn", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--games is not a plan flag (it belongs to eval)" in err
    assert "--resume is not a plan flag (it belongs to train)" in err and "--suite" in err
    assert main(["spiral-jax", "export", f"--config={TINY}", "--resume"]) == 2


def _no_training(monkeypatch):
    """Building a Trainer fails the test: the command line should have been refused before."""
    import spiral_jax.run

    def trainer(*args, **kwargs):
        raise AssertionError("the command line was accepted and training started")

    monkeypatch.setattr(spiral_jax.run, "Trainer", trainer)


@pytest.mark.parametrize("extra", [["--resume", "true"], ["stray"], ["--", "--config.train.steps=3"]])
def test_an_argument_that_is_not_a_flag_is_refused_not_dropped(extra, tmp_path, capsys, monkeypatch):
    _no_training(monkeypatch)
    assert main(["spiral-jax", "train", f"--config={TINY}", f"--config.out_dir={tmp_path / 'run'}", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spiral-jax train: unexpected argument {extra[-1]!r}; flags are --name=VALUE") and "\n" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name, what", [("configs", "is a folder"), ("config.json", "is not a Python file (.py)"),
                                        ("missing.py", "does not exist")])
def test_a_config_that_is_not_a_python_file_is_named_as_such(name, what, tmp_path, capsys):
    (tmp_path / "configs").mkdir()
    (tmp_path / "config.json").write_text("{}")
    assert main(["spiral-jax", "config", f"--config={tmp_path / name}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"spiral-jax config: cannot load the config file: config file {tmp_path / name} {what}; pass a "
                   f"Python file with a get_config() function (the presets are in configs/)")


def test_resume_without_a_checkpoint_fails_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    _no_training(monkeypatch)
    (tmp_path / "run" / "checkpoints" / "3.orbax-checkpoint-tmp-1").mkdir(parents=True)  # no finished step
    for out_dir in (tmp_path / "new", tmp_path / "run"):
        assert main(["spiral-jax", "train", f"--config={TINY}", f"--config.out_dir={out_dir}", "--resume"]) == 1
        assert capsys.readouterr().err.strip() == (
            f"spiral-jax train: RunDirError: no checkpoint to resume from in {out_dir / 'checkpoints'}; leave out "
            f"--resume to start a new run, or give the run's folder as --config.out_dir")
    assert not (tmp_path / "new").exists() and not (tmp_path / "run" / "run.lock").exists()


@pytest.mark.parametrize("command, extra, message", [
    ("eval", ["--games=3"], "--games=3: evaluation plays each matchup from both seats equally"),
    ("eval", ["--suite=kuhn", "--env_ids=Nim-v0"], "--env_ids is for --suite games; --suite kuhn does not read it"),
    ("eval", ["--opponents=openai:m@http://127.0.0.1:{busy}/v1", "--config.api.timeout_s=2"],
     "ConnectionError: the API opponent at http://127.0.0.1:{busy}/v1 did not answer"),  # a listener that never replies
    ("export", ["--out={tmp}/hf", "--max_shard_gib=0"], "--max_shard_gib=0: give the largest safetensors file in GiB"),
    ("export", ["--out={tmp}/hf", "--max_shard_gib=inf"], "--max_shard_gib=inf: give the largest safetensors file"),
    ("export", ["--out={tmp}/hf", "--adapter"], "--adapter writes a LoRA run's adapters, and this run trains none"),
    ("export", ["--out={tmp}/hf", "--adapter", "--dtype=bfloat16", "--config.model.lora.rank=4"],
     "--dtype is for merged weights; --adapter writes the adapters as trained (float32, one file)"),
    ("export", ["--out={tmp}/hf", "--adapter", "--config.model.lora.rank=4"],
     "--adapter writes adapters that load on top of the weights at model.path, and this run's frozen weights are "
     "a random init (model.path is empty) that no folder holds; leave out --adapter"),
    ("serve", ["--port=65536"], "serve: port 65536 is not a TCP port; give one of 1-65535, or 0 for any free one"),
    ("serve", ["--max_tokens=0"], "serve: max_tokens must be at least 1, got 0"),
    ("serve", ["--api_key="], "serve: api_key is empty; give a key or none"),
    ("serve", ["--timeout_s=0"], "serve: timeout_s must be a number of seconds above 0, got 0"),
    ("serve", ["--shutdown_s=-1"], "serve: shutdown_s must be a number of seconds, 0 or more, got -1"),
    ("serve", ["--max_body_mb=nan"], "--max_body_mb=nan: give the largest request body in MB, a number above 0"),
    ("serve", ["--allow_origin=https://app.example/"], "allow_origin 'https://app.example/' is not an origin as"),
    ("serve", ["--host=no.such.host.invalid"], "cannot listen on no.such.host.invalid:8000 ("),
    ("serve", ["--port={busy}"], "cannot listen on 127.0.0.1:{busy} (Address already in use); pick another --port")])
def test_flags_that_cannot_work_fail_before_the_weights_load(command, extra, message, tmp_path, capsys, monkeypatch):
    import spiral_jax.run.build

    def load_policy(*args, **kwargs):
        raise AssertionError("the flags were accepted and the weights loaded")

    monkeypatch.setattr(spiral_jax.run.build, "load_policy", load_policy)
    busy = socket.create_server(("127.0.0.1", 0))  # a port some other server listens on
    port = busy.getsockname()[1]
    extra, message = [arg.format(tmp=tmp_path, busy=port) for arg in extra], message.format(busy=port)
    assert main(["spiral-jax", command, f"--config={TINY}", f"--config.out_dir={tmp_path / 'run'}", *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spiral-jax {command}: ") and message in err and "\n" not in err, err
    assert not (tmp_path / "hf").exists()
    busy.close()


def test_config_given_twice_is_refused(capsys):
    kuhn = os.path.join(REPO, "configs", "tiny_kuhn.py")
    assert main(["spiral-jax", "config", f"--config={TINY}", "--config", kuhn]) == 2
    assert capsys.readouterr().err.strip() == (f"spiral-jax config: --config is given 2 times ({TINY}, {kuhn}); give one "
                                               f"config file and change its values with --config.a.b=value")


def test_config_prints_the_resolved_config(capsys):
    assert main(["spiral-jax", "config", f"--config={TINY}", "--config.train.steps=7"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["train"]["steps"] == 7 and config["games"]["env_ids"] == ["TicTacToe-v0"]
    assert main(["spiral-jax", "config", f"--config={TINY}", "--config.train.steps=-7"]) == 1  # checked, as train would
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == "spiral-jax config: ValueError: train.steps=-7: give at least 0"


@pytest.mark.parametrize("overrides, message", [
    (["--config.eval.env_ids=('KuhnPokr-v1',)"], "unknown env id 'KuhnPokr-v1'"),
    (["--config.games.env_ids=('TicTacToe-v0','KuhnPoker-v1')"], "games.weights has 1 entries for 2 games.env_ids"),
    (["--config.rollout.mode=fixed_opponent", "--config.rollout.opponent=self"], "give --config.rollout.mode=self_play"),
    (["--config.rollout.mode=pool", "--config.train.steps=5"], "rollout.pool_every=10 steps, and train.steps=5")])
def test_config_refuses_what_train_refuses_before_loading_the_model(overrides, message, capsys):
    """`spiral-jax config` (and `launch`, which checks a run's overrides with it) fails on the games and
    modes train refuses at its start (it checked each value alone); a model folder only the hosts hold
    yet is not looked for."""
    assert main(["spiral-jax", "config", f"--config={TINY}", *overrides]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("spiral-jax config: ValueError: ") and message in err, err
    assert main(["spiral-jax", "config", f"--config={TINY}", "--config.model.path=/not/here/yet",
                 "--config.rollout.max_new_tokens=4096"]) == 0


@pytest.mark.parametrize("override, message", [
    ("--config.train.stepz=7", "--config.train.stepz: config.train has no field 'stepz' (did you mean 'steps'?); "
                               "spiral-jax config --config {file} prints every field"),
    ("--config.trainn.steps=7", "--config.trainn.steps: the config has no field 'trainn' (did you mean 'train'?)"),
    ("--config.train.qqqq=7", "--config.train.qqqq: config.train has no field 'qqqq'; "),
    ("--config.train.steps.x=7", "--config.train.steps.x: config.train.steps is a value (int), not a group of "
                                 "fields; set it with --config.train.steps=VALUE")])
def test_an_override_of_a_field_the_config_lacks_names_the_flag_and_the_closest_fields(override, message, capsys):
    assert main(["spiral-jax", "train", f"--config={TINY}", "--config.train.steps=3", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spiral-jax train: " + message.format(file=TINY)) and "\\" not in err, err


IN_USE = ("Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 4242. Not "
          "attempting to load libtpu.so in this process. (set JAX_PLATFORMS='' to automatically choose an "
          "available backend)")


def _devices_fail_to_start(monkeypatch, message: str):
    """The commands' first use of the devices (`distributed.initialize`) raises JAX's RuntimeError."""
    import spiral_jax.distributed

    def initialize(*args, **kwargs):
        raise RuntimeError(message)

    monkeypatch.setattr(spiral_jax.distributed, "initialize", initialize)


@pytest.mark.parametrize("command", ["train", "eval", "export", "serve"])
def test_an_accelerator_that_does_not_start_is_one_line_with_what_to_do(command, tmp_path, capsys, monkeypatch):
    """JAX's error when the TPU is held by another process (a run still going, a notebook), as the first
    use of the devices raises it: one line naming it and the fix, no traceback, no run folder made."""
    _devices_fail_to_start(monkeypatch, IN_USE)
    out_dir = tmp_path / "run"
    args = ["--out", str(tmp_path / "exported")] if command == "export" else []
    assert main(["spiral-jax", command, f"--config={TINY}", f"--config.out_dir={out_dir}", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"spiral-jax {command}: Unable to initialize backend 'tpu'")
    assert "pid 4242" in err and "another process may hold the chips" in err and "JAX_PLATFORMS=cpu" in err, err
    assert "Traceback" not in err and not out_dir.exists()


def test_other_runtime_errors_keep_their_traceback(tmp_path, monkeypatch):
    _devices_fail_to_start(monkeypatch, "something else went wrong")
    with pytest.raises(RuntimeError, match="something else"):
        main(["spiral-jax", "train", f"--config={TINY}", f"--config.out_dir={tmp_path / 'run'}"])


@pytest.mark.parametrize("command, extra, said", [
    ("eval", [], "the report was not written"),
    ("export", ["--out={tmp}/hf"], "--out holds a partial export: run the command again with --overwrite"),
    ("train", [], "before the first step"),
    ("serve", [], "")])
def test_ctrl_c_while_the_weights_load_is_one_line_and_status_130(command, extra, said, tmp_path, capsys, monkeypatch):
    """Ctrl-C outside train's loop (which saves and exits 75 itself): no traceback, what is left behind."""
    import spiral_jax.run
    import spiral_jax.run.build

    def load(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(spiral_jax.run.build, "load_policy", load)
    monkeypatch.setattr(spiral_jax.run, "Trainer", load)
    extra = [arg.format(tmp=tmp_path) for arg in extra]
    assert main(["spiral-jax", command, f"--config={TINY}", f"--config.out_dir={tmp_path / 'run'}", *extra]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"spiral-jax {command}: interrupted") and said in err and "\n" not in err, err


def test_commands_on_a_machine_without_a_tpu_run_without_libtpus_errors():
    """libtpu installed (the test and tpu extras) on a machine with no TPU: JAX would start it and print
    its errors about the missing TPU before falling back to the CPU. The commands run on the CPU without
    them, and JAX_PLATFORMS still decides where it is set."""
    pytest.importorskip("libtpu")
    if Path("/dev/vfio").exists() or any(Path("/dev").glob("accel*")):  # what may be a TPU's device files
        pytest.skip("this machine has device files a TPU would have; JAX is left to look for it")
    code = "import sys, jax; from spiral_jax.cli import main; main(sys.argv); print(jax.devices()[0].platform)"
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT")}
    for given, platform in ((None, "cpu"), ("cpu", "cpu")):
        run = subprocess.run([sys.executable, "-c", code, "plan", "--config", "configs/tiny_pig.py"],
                             env={**env, **({"JAX_PLATFORMS": given} if given else {})}, capture_output=True,
                             text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split()[-1] == platform and "TPU" not in run.stderr, run.stderr[-2000:]
