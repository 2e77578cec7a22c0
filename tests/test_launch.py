"""`spiral-jax launch`: the gcloud / ssh command lines it generates (dry run), and its decisions on a stubbed
gcloud (an existing TPU VM is reused, a missing one created, failures say which step and how to retry)."""
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from spiral_jax import launch

REPO = str(Path(__file__).resolve().parents[1])
EXTRA = ["--config.model.path=/ckpt/My Model", "--config.out_dir=runs/it's \"quoted\"", "--resume"]


def dry(capsys, *argv):
    rc = launch.main([argv[0], "--dry-run", *argv[1:]])
    out, err = capsys.readouterr()
    return rc, [line for line in out.splitlines() if line.strip()], err


def remote_script(line: str) -> str:
    """The script of a `gcloud ... ssh --command=SCRIPT` or `ssh HOST SCRIPT` line."""
    argv = shlex.split(line)
    for a in argv:
        if a.startswith("--command="):
            return a[len("--command="):]
    assert argv[0] == "ssh", line
    return argv[2]


def train_args(script: str) -> list[str]:
    """The argv of the `nohup ...` training command inside a start script."""
    words = shlex.split(script)
    start = words.index("nohup") + 1
    return words[start:words.index(">", start)]


TPU_CASES = [  # (accelerator given, accelerator type for gcloud, TPU software version, hosts)
    ("v4-8", "v4-8", "tpu-ubuntu2204-base", 1),
    ("v4-16", "v4-16", "tpu-ubuntu2204-base", 2),
    ("v5e-8", "v5litepod-8", "v2-alpha-tpuv5-lite", 1),
    ("v5litepod-16", "v5litepod-16", "v2-alpha-tpuv5-lite", 4),
    ("v5p-8", "v5p-8", "v2-alpha-tpuv5", 1),
    ("v5p-16", "v5p-16", "v2-alpha-tpuv5", 2),
    ("v6e-8", "v6e-8", "v2-alpha-tpuv6e", 1),
    ("v6e-16", "v6e-16", "v2-alpha-tpuv6e", 4),
]


@pytest.mark.parametrize("given,accelerator,runtime,hosts", TPU_CASES)
def test_tpu_dry_run(capsys, given, accelerator, runtime, hosts):
    assert launch.parse_accelerator(given).hosts == hosts
    rc, lines, _ = dry(capsys, "tpu", "--name", "spiral", "--zone", "us-east5-a", "--accelerator", given,
                       "--project", "my-proj", "--spot", "--repo", REPO, "--config", "configs/mesh_tpu_v4_8.py",
                       "--", *EXTRA)
    assert rc == 0
    describe, create, pack, scp, install, start = lines
    assert describe.startswith("gcloud compute tpus tpu-vm describe spiral --zone=us-east5-a --project=my-proj")
    create_argv = shlex.split(create.split("  #")[0])
    assert create_argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "spiral"]
    assert f"--accelerator-type={accelerator}" in create_argv and f"--version={runtime}" in create_argv
    assert "--spot" in create_argv and "--zone=us-east5-a" in create_argv
    assert shlex.split(pack)[:2] == ["bash", "-c"] and "ls-files" in pack
    assert "--worker=all" in shlex.split(scp)
    for line in (install, start):
        assert "--worker=all" in shlex.split(line)
    assert "pip install" in remote_script(install) and "'.[tpu]'" in remote_script(install)
    argv = train_args(remote_script(start))
    assert argv[:6] == [".venv/bin/python", "-m", "spiral_jax.cli", "train", "--config", "configs/mesh_tpu_v4_8.py"]
    assert ("--config.distributed.enabled=True" in argv) == (hosts > 1)
    assert argv[-3:] == EXTRA  # quoting survives both shells


def test_tpu_from_git_url_and_helpers(capsys):
    rc, lines, _ = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8",
                       "--repo", "https://github.com/me/spiral_jax.git", "--ref", "dev", "--config", "configs/x.py",
                       "--setup", "hf download Qwen/Qwen3-0.6B --local-dir 'ckpt/Qwen3 0.6B'")
    assert rc == 0 and len(lines) == 4  # describe, create, install, start: nothing packed or copied
    install = remote_script(lines[2])
    assert "git clone -q https://github.com/me/spiral_jax.git spiral_jax" in install
    assert "fetch -q origin dev" in install
    assert install.endswith("; hf download Qwen/Qwen3-0.6B --local-dir 'ckpt/Qwen3 0.6B'")
    for config in ("/home/me/spiral_jax/configs/x.py", "../x.py", "~/x.py"):  # not a path in the clone
        rc, _, err = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8",
                         "--repo", "https://github.com/me/spiral_jax.git", "--config", config)
        assert rc == 2 and "its path inside it" in err, config
    for flag, verb in [("--stop", "ssh"), ("--logs", "ssh"), ("--delete", "delete")]:
        rc, lines, _ = dry(capsys, "tpu", "--name", "t", "--zone", "z", flag)
        assert rc == 0 and len(lines) == 1 and shlex.split(lines[0])[4] == verb
    assert "kill" in remote_script(dry(capsys, "tpu", "--name", "t", "--zone", "z", "--stop")[1][0])


def test_gpu_two_hosts(capsys):
    rc, lines, _ = dry(capsys, "gpu", "--hosts", "gpu-a,me@gpu-b", "--port", "2345", "--remote-dir", "/srv/spiral",
                       "--python", ".venv/bin/python", "--config", "configs/mesh_gpu_8x.py", "--", *EXTRA)
    assert rc == 0 and len(lines) == 2
    for i, (line, host) in enumerate(zip(lines, ["gpu-a", "me@gpu-b"])):
        assert shlex.split(line)[:2] == ["ssh", host]
        script = remote_script(line)
        assert "cd /srv/spiral" in script
        assert f"JAX_COORDINATOR_ADDRESS=gpu-a:2345 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID={i} nohup" in script
        argv = train_args(script)
        assert argv[:6] == [".venv/bin/python", "-m", "spiral_jax.cli", "train", "--config", "configs/mesh_gpu_8x.py"]
        assert "--config.distributed.enabled=True" in argv and argv[-3:] == EXTRA


def test_gpu_one_host(capsys, monkeypatch):
    rc, lines, _ = dry(capsys, "gpu", "--hosts", "gpu-a", "--remote-dir", "/srv/spiral",
                       "--config", "configs/mesh_gpu_8x.py", "--", *EXTRA)
    assert rc == 0 and len(lines) == 1
    script = remote_script(lines[0])
    assert "JAX_" not in script and "distributed" not in script and train_args(script)[-3:] == EXTRA
    monkeypatch.chdir(REPO)
    rc, lines, _ = dry(capsys, "gpu", "--config", "configs/mesh_gpu_8x.py", "--", *EXTRA)
    assert rc == 0
    assert shlex.split(lines[0]) == [sys.executable, "-m", "spiral_jax.cli", "train", "--config",
                                     "configs/mesh_gpu_8x.py", *EXTRA]


def test_usage_errors(capsys):
    rc, _, err = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v3-8", "--config", "c.py")
    assert rc == 2 and "unknown TPU accelerator type 'v3-8'" in err
    assert all(k in err for k in ("v4-8", "v5litepod", "v5p-8", "v6e"))
    rc, _, err = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v5p-12", "--config", "c.py")
    assert rc == 2 and "unknown TPU accelerator type" in err
    rc, _, err = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v5p-8")
    assert rc == 2 and "--config is required" in err
    rc, _, err = dry(capsys, "gpu", "--hosts", "a,b")
    assert rc == 2 and "--config is required" in err
    rc, _, err = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8", "--repo", REPO,
                     "--config", "configs/no_such.py")
    assert rc == 2 and "no such file" in err
    rc, _, err = dry(capsys, "gpu", "--hosts", "a,b", "--config", "c.py", "--config.train.steps=3")
    assert rc == 2 and "after `--`" in err
    rc, _, err = dry(capsys, "gpu", "--hosts", "localhost,b", "--remote-dir", "/x", "--config", "c.py")
    assert rc == 2 and "coordinator" in err


@pytest.mark.parametrize("argv, message", [
    (["gpu", "--hosts=", "--config", "c.py"], "--hosts is empty; give one host or a comma-separated list"),
    (["gpu", "--hosts", "a,b,a", "--config", "c.py"], "--hosts lists a twice; one process runs on each host"),
    (["gpu", "--hosts", "a b,c", "--config", "c.py"], "--hosts: 'a b' is not a host ([user@]host); separate hosts"),
    (["gpu", "--hosts", "a,b", "--port", "70000", "--config", "c.py"], "--port 70000 is not a TCP port; give one"),
    (["tpu", "--name=", "--zone", "z", "--accelerator", "v4-8", "--config", "c.py"], "--name and --zone need a value"),
    (["tpu", "--name", "t", "--zone", "z", "--stop", "--delete"], "pass one of --stop, --logs and --delete"),
    (["gpu", "--config", "configs/mesh_gpu_8x.py", "--", "--games", "4"], "'--games' after `--` is not a train flag"),
    (["tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8", "--config", "configs/mesh_tpu_v4_8.py", "--",
      "--config.train.steps", "3", "stray"], "'stray' after `--` is not a train flag (--resume, --overwrite)"),
    (["gpu", "--config", "configs/mesh_gpu_8x.py", "--", "--config", "other.py"], "--config goes before `--`"),
    # Overrides are applied to the local config file, as every host would apply them after its setup.
    (["tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8", "--config", "configs/mesh_tpu_v4_8.py", "--",
      "--resume", "--config.train.stepz", "3"], "the train arguments after `--` do not apply to "
     f"{REPO}/configs/mesh_tpu_v4_8.py: --config.train.stepz: config.train has no field 'stepz' (did you mean"),
    (["gpu", "--hosts", "a,b", "--config", "configs/mesh_gpu_8x.py", "--", "--config.rollout.top_p=0"],
     "the train arguments after `--` do not apply to {REPO}/configs/mesh_gpu_8x.py: ValueError: rollout.top_p=0.0: "
     "give more than 0 and at most 1")])
def test_flags_that_cannot_work_are_refused_before_any_step(argv, message, capsys, monkeypatch):
    """Refused here rather than by a host (after a TPU VM is made and the project installed), or used
    otherwise than asked (--hosts= ran the training on this host)."""
    monkeypatch.chdir(REPO)
    rc, lines, err = dry(capsys, *argv)
    message = message.replace("{REPO}", REPO)
    assert rc == 2 and not lines and err.startswith(f"spiral-jax launch {argv[0]}: {message}"), err


REAL_RUN = subprocess.run


class FakeGcloud:
    """Stands in for subprocess.run: answers `describe` as told, records every command, fails `fail_on`.
    A local `git` query (the checkout's top level) runs for real and is not recorded."""

    def __init__(self, describe_rc=0, describe_out="READY\tv5p-8\n", describe_err="", fail_on=None):
        self.calls, self.describe = [], (describe_rc, describe_out, describe_err)
        self.fail_on = fail_on

    def __call__(self, argv, text=True, capture_output=False):
        if argv[0] == "git":
            return REAL_RUN(argv, text=text, capture_output=capture_output)
        self.calls.append(list(argv))
        if "describe" in argv:
            rc, out, err = self.describe
            return subprocess.CompletedProcess(argv, rc, out, err)
        if self.fail_on and any(self.fail_on in a for a in argv):
            return subprocess.CompletedProcess(argv, 255, "", "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    def verbs(self):
        return [c[4] if c[0] == "gcloud" else c[0] for c in self.calls]


TPU_ARGS = ["tpu", "--name", "spiral", "--zone", "us-east5-a", "--accelerator", "v5p-8", "--repo", REPO,
            "--config", "configs/mesh_tpu_v4_8.py"]


def stub(monkeypatch, fake, have=("gcloud", "bash", "ssh")):
    monkeypatch.setattr(launch.runner.subprocess, "run", fake)
    monkeypatch.setattr(launch.runner.shutil, "which", lambda tool: f"/usr/bin/{tool}" if tool in have else None)


def test_existing_vm_is_reused(monkeypatch, capsys):
    fake = FakeGcloud()
    stub(monkeypatch, fake)
    assert launch.main(TPU_ARGS) == 0
    assert fake.verbs() == ["describe", "bash", "scp", "ssh", "ssh"]  # no create
    assert "reusing TPU VM spiral" in capsys.readouterr().err


def test_missing_vm_is_created(monkeypatch):
    fake = FakeGcloud(describe_rc=1, describe_out="", describe_err="ERROR: NOT_FOUND: Resource not found")
    stub(monkeypatch, fake)
    assert launch.main(TPU_ARGS) == 0
    assert fake.verbs() == ["describe", "create", "bash", "scp", "ssh", "ssh"]
    assert "--accelerator-type=v5p-8" in fake.calls[1] and "--version=v2-alpha-tpuv5" in fake.calls[1]


def test_failures_say_what_and_how_to_retry(monkeypatch, capsys):
    stub(monkeypatch, FakeGcloud(describe_out="READY\tv4-8\n"))
    assert launch.main(TPU_ARGS) == 1
    assert "exists in us-east5-a as v4-8, not v5p-8" in capsys.readouterr().err
    stub(monkeypatch, FakeGcloud(fail_on="pip install"))
    assert launch.main(TPU_ARGS) == 1
    err = capsys.readouterr().err
    assert "step failed: install the project on every worker (exit status 255)" in err
    assert "--worker=0" in err and "retry:" in err
    stub(monkeypatch, FakeGcloud(describe_rc=1, describe_err="ERROR: PERMISSION_DENIED"))
    assert launch.main(TPU_ARGS) == 1
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    stub(monkeypatch, FakeGcloud(), have=())
    assert launch.main(TPU_ARGS) == 1
    assert "`gcloud` is not on PATH" in capsys.readouterr().err
    stub(monkeypatch, FakeGcloud(), have=())
    assert launch.main(["gpu", "--hosts", "a,b", "--remote-dir", "/x", "--config", "c.py"]) == 1
    assert "`ssh` is not on PATH" in capsys.readouterr().err


def test_cli_dispatches_launch(capsys):
    from spiral_jax import cli

    assert cli.main(["spiral-jax", "launch", "tpu", "--name", "t", "--zone", "z", "--delete", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("gcloud compute tpus tpu-vm delete t --zone=z")


def test_remote_scripts_run(tmp_path, monkeypatch):
    """The start / stop scripts in a real bash: background start with pid file, no second start, SIGTERM
    stop, and a command that dies at once is reported with the end of its log."""
    monkeypatch.setattr(launch.scripts, "CHECK_AFTER_S", 1)

    def bash(script):
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)

    (tmp_path / "one").mkdir()
    (tmp_path / "other").mkdir()

    for script in (launch.install_script("d", "https://x/y.git", "main", None, "3.11"),
                   launch.install_script("d", None, "HEAD", "d.tgz", "3.11"), launch.logs_script("d")):
        assert bash("set -n; " + script).returncode == 0, script
    work = str(tmp_path / "one")
    # A stand-in for training whose command line has the train command's `spiral_jax.cli train`.
    train = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "spiral_jax.cli", "train"]
    started = bash(launch.start_script(work, train, {"JAX_PROCESS_ID": "0"}))
    assert started.returncode == 0, started.stderr
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    pid = int((tmp_path / "one" / launch.PID_FILE.replace("$(hostname)", host)).read_text())
    try:
        again = bash(launch.start_script(work, train))
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        stopped = bash(launch.stop_script(work))
    assert stopped.returncode == 0 and f"sent SIGTERM to pid {pid}" in stopped.stdout
    dead = bash(launch.start_script(str(tmp_path / "other"), ["bash", "-c", "echo boom-in-the-log; exit 3"]))
    assert dead.returncode == 1 and "exited at once" in dead.stderr and "boom-in-the-log" in dead.stderr


def test_gpu_hosts_start_together_and_failures_name_the_host(monkeypatch, capsys):
    fake = FakeGcloud(fail_on="JAX_PROCESS_ID=1 ")
    stub(monkeypatch, fake)
    assert launch.main(["gpu", "--hosts", "a,b,c", "--remote-dir", "/x", "--config", "c.py"]) == 1
    assert sorted(c[1] for c in fake.calls) == ["a", "b", "c"]  # all three were started
    err = capsys.readouterr().err
    assert "1 of 3 failed" in err and "start process 1 on b" in err and "--stop" in err


def test_hints_name_the_project_and_the_remote_dir(monkeypatch, capsys):
    """The --stop / --logs / --delete commands printed after a launch act on the launch's project and
    folder: the printed --stop runs the stop script in --remote_dir."""
    stub(monkeypatch, FakeGcloud())
    assert launch.main([*TPU_ARGS, "--project", "my-proj", "--remote_dir", "work/sj 2"]) == 0
    err = capsys.readouterr().err
    where = "spiral-jax launch tpu --name spiral --zone us-east5-a --project my-proj --remote_dir 'work/sj 2'"
    for verb in ("--logs", "--stop", "--delete"):
        assert f"`{where} {verb}`" in err
    stop = shlex.split(err.split("stop: `")[1].split("`")[0])
    rc, lines, _ = dry(capsys, *stop[2:])
    assert rc == 0 and "--project=my-proj" in shlex.split(lines[0])
    assert remote_script(lines[0]).startswith("cd 'work/sj 2';")
    stub(monkeypatch, FakeGcloud(describe_out="PREEMPTED\tv5p-8\n"))
    assert launch.main([*TPU_ARGS, "--project", "my-proj"]) == 1
    assert "--name spiral --zone us-east5-a --project my-proj --delete`" in capsys.readouterr().err
    stub(monkeypatch, FakeGcloud())  # gpu: the folder is named, also when it is the default (this one)
    monkeypatch.chdir(REPO)
    assert launch.main(["gpu", "--hosts", "a,b", "--config", "configs/mesh_gpu_8x.py"]) == 0
    assert f"stop: `spiral-jax launch gpu --hosts a,b --remote_dir {REPO} --stop`" in capsys.readouterr().err


def test_a_nested_remote_dir_gets_its_archive_in_the_home_folder(capsys):
    rc, lines, _ = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8", "--repo", REPO,
                       "--remote_dir", "work/sj", "--config", "configs/mesh_tpu_v4_8.py")
    assert rc == 0
    _, _, _, scp, install, start = lines
    assert shlex.split(scp)[6] == "t:work_sj.tgz"  # no folder a fresh VM lacks
    assert "mkdir -p work/sj; tar -xzf work_sj.tgz -C work/sj; cd work/sj;" in remote_script(install)
    assert remote_script(start).startswith("set -e; cd work/sj;")


def _checkout(tmp_path):
    root = tmp_path / "proj"
    (root / "configs").mkdir(parents=True)
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "configs" / "x.py").write_text("")
    (root / "sub" / "y.py").write_text("")
    (tmp_path / "outside.py").write_text("")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


def _start_config(capsys, *argv):
    rc, lines, err = dry(capsys, "tpu", "--name", "t", "--zone", "z", "--accelerator", "v4-8", *argv)
    if rc != 0:
        return rc, err
    pack = shlex.split(lines[2])[2]
    argv = train_args(remote_script(lines[-1]))
    return argv[argv.index("--config") + 1], pack


def test_config_is_sent_relative_to_the_checkout_root(tmp_path, monkeypatch, capsys):
    """From a subfolder --repo . is the whole checkout; --config is passed to the workers relative to its
    root, whether given from the root, from the current folder or as an absolute path; a config outside
    the checkout is refused before any VM is made."""
    root = _checkout(tmp_path)
    monkeypatch.chdir(root / "sub" / "deeper")
    for config, sent in [("configs/x.py", "configs/x.py"), ("../../configs/x.py", "configs/x.py"),
                         ("../y.py", "sub/y.py"), (str(root / "configs" / "x.py"), "configs/x.py")]:
        got, pack = _start_config(capsys, "--config", config)
        assert got == sent, config
        assert f"git -C {shlex.quote(str(root))} ls-files" in pack  # the root, not the subfolder
    rc, err = _start_config(capsys, "--config", str(tmp_path / "outside.py"))
    assert rc == 2 and "outside the project" in err
    rc, err = _start_config(capsys, "--config", "../../../outside.py")
    assert rc == 2 and "outside the project" in err
    plain = tmp_path / "plain"  # not a git checkout: the folder itself
    (plain / "configs").mkdir(parents=True)
    (plain / "configs" / "x.py").write_text("")
    got, pack = _start_config(capsys, "--repo", str(plain), "--config", str(plain / "configs" / "x.py"))
    assert got == "configs/x.py" and f"git -C {shlex.quote(str(plain))} ls-files" in pack


def test_a_git_url_over_a_copied_checkout_says_what_to_do(tmp_path):
    home = tmp_path / "home"
    (home / "sj").mkdir(parents=True)
    (home / "sj" / "pyproject.toml").write_text("")
    script = launch.install_script("sj", "https://example.invalid/x.git", "main", None, "3.11")
    done = subprocess.run(["bash", "-c", script], cwd=home, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "~/sj holds a copied checkout, not a git clone" in done.stderr and "another --remote_dir" in done.stderr


def test_a_stale_pid_file_is_no_run(tmp_path, monkeypatch):
    """A pid file whose pid now belongs to another process (the pid reused after a reboot): --stop leaves
    that process alone, and a launch starts."""
    monkeypatch.setattr(launch.scripts, "CHECK_AFTER_S", 1)
    other = subprocess.Popen(["sleep", "60"])
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    pid_file = tmp_path / launch.PID_FILE.replace("$(hostname)", host)
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text(f"{other.pid}\n")
    train = [sys.executable, "-c", "import time; time.sleep(60)", "-m", "spiral_jax.cli", "train"]
    try:
        stopped = subprocess.run(["bash", "-c", launch.stop_script(str(tmp_path))], capture_output=True,
                                 text=True, timeout=30)
        assert "nothing running" in stopped.stdout and other.poll() is None
        started = subprocess.run(["bash", "-c", launch.start_script(str(tmp_path), train)], capture_output=True,
                                 text=True, timeout=30)
        assert started.returncode == 0, started.stderr
        assert int(pid_file.read_text()) != other.pid
    finally:
        subprocess.run(["bash", "-c", launch.stop_script(str(tmp_path))], capture_output=True, timeout=30)
        other.kill()
        other.wait()


def test_gpu_one_local_host_runs_in_remote_dir(tmp_path, monkeypatch, capsys):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "x.py").write_text("")
    monkeypatch.chdir(REPO)
    rc, lines, _ = dry(capsys, "gpu", "--remote_dir", str(tmp_path), "--config", "configs/x.py")
    assert rc == 0
    assert lines[0] == f"cd {shlex.quote(str(tmp_path))} && " + shlex.join(
        [sys.executable, "-m", "spiral_jax.cli", "train", "--config", "configs/x.py"])
    execs = []
    monkeypatch.setattr(launch.runner.os, "execvp", lambda prog, argv: execs.append((os.getcwd(), argv)))
    assert launch.main(["gpu", "--remote_dir", str(tmp_path), "--config", "configs/x.py"]) == 0
    assert execs and execs[0][0] == str(tmp_path)
    for flags in (["--port", "2345"], ["--coordinator", "gpu-a"]):
        rc, _, err = dry(capsys, "gpu", *flags, "--config", "configs/mesh_gpu_8x.py")
        assert rc == 2 and "several hosts" in err
    rc, _, err = dry(capsys, "gpu", "--hosts", "gpu-a", "--port", "2345", "--config", "configs/mesh_gpu_8x.py")
    assert rc == 2 and "several hosts" in err
    rc, _, err = dry(capsys, "gpu", "--remote_dir", str(tmp_path / "nope"), "--config", "configs/x.py")
    assert rc == 2 and "no such folder" in err
