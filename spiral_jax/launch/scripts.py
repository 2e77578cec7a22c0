"""What `spiral-jax launch` runs on the hosts: the `spiral-jax train` command line and the shell
scripts that install the project, start training in the background, stop it and show its log.
Everything user-given is shlex-quoted; $(hostname) and $! are left to the remote shell."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

from spiral_jax.launch.runner import UsageError

LAUNCH_DIR = "runs/launch"  # under the remote project folder; runs/ is git-ignored, so never overwritten
# Expanded by the remote shell: one of each per host, also when hosts share the folder (NFS home).
PID_FILE = f"{LAUNCH_DIR}/train-$(hostname).pid"
LOG_FILE = f"{LAUNCH_DIR}/train-$(hostname).log"
CHECK_AFTER_S = 10  # after starting, wait this long and report a process that already died
# What the command line of a process started by start_script contains (train_argv runs `-m spiral_jax.cli
# train`): a pid file whose pid now belongs to another process (after a reboot) is stale, not a run.
TRAIN_MARK = "spiral_jax.cli train"


def _running(pid_file: str) -> str:
    """Shell test: the pid file names a live process that is a training run."""
    return (f'[ -f {pid_file} ] && kill -0 "$(cat {pid_file})" 2>/dev/null && '
            f'ps -ww -o args= -p "$(cat {pid_file})" 2>/dev/null | grep -q -F {shlex.quote(TRAIN_MARK)}')


def require_config(args, local_root: str | None) -> None:
    """--config is given and, when the project is a local folder, names a file in it."""
    if not args.config:
        raise UsageError("--config is required (e.g. --config configs/mesh_tpu_v4_8.py); train arguments "
                         "go after `--`")
    if local_root and not os.path.isabs(args.config) and not os.path.exists(os.path.join(local_root, args.config)):
        raise UsageError(f"--config {args.config}: no such file in {local_root}")


def config_in_root(config: str, root: str, cwd: str) -> str:
    """--config as a path relative to the project root `root`, the folder that is copied to the workers
    and where training runs there. A relative path is taken from the root (configs/X.py), else from the
    current folder (a launch from a subfolder); an absolute one must lie inside the root."""
    if os.path.isabs(config):
        candidates = [config]
    else:
        candidates = [os.path.join(root, config), os.path.join(cwd, config)]
    path = next((c for c in candidates if os.path.isfile(c)), None)
    if path is None:
        raise UsageError(f"--config {config}: no such file in {root}")
    real_root, real_path = os.path.realpath(root), os.path.realpath(path)
    if os.path.commonpath([real_root, real_path]) != real_root:
        raise UsageError(f"--config {config}: {real_path} is outside the project copied to the workers "
                         f"({real_root}); put the config in the project (e.g. configs/) or pass --repo "
                         "a checkout that holds it")
    return os.path.relpath(real_path, real_root)


def _in_overrides(extra: list[str]) -> list[bool]:
    """For each argument after `--`, whether it belongs to a --config.a.b override: the override, or
    the word after one written without = (its value)."""
    inside, value = [], False
    for arg in extra:
        inside.append(value or arg.startswith("--config."))
        value = not value and arg.startswith("--config.") and "=" not in arg
    return inside


def check_train_args(extra: list[str]) -> None:
    """The train arguments after `--`, checked here rather than on the hosts once they are set up:
    flags of `spiral-jax train` (--resume, --overwrite) and --config.a.b overrides."""
    from spiral_jax.cli import COMMANDS

    allowed = {f"--{no}{n}" for n in COMMANDS["train"][1] if n != "config" for no in ("", "no")}
    for arg, override in zip(extra, _in_overrides(extra)):
        if override:
            continue
        name = arg.split("=", 1)[0]
        if name == "--config":
            raise UsageError("--config goes before `--` (the launch checks and copies it); after `--` come train "
                             "flags and --config.a.b=value overrides")
        if name not in allowed:
            raise UsageError(f"{arg!r} after `--` is not a train flag (--resume, --overwrite) or a --config.a.b=value "
                             f"override; see spiral-jax train --help")


def check_overrides(config: str, extra: list[str]) -> None:
    """The --config.a.b overrides after `--` applied to the config file `config` (a local path) by
    `spiral-jax config` in a child process, so that an unknown key or a value out of range fails here
    rather than on every host once it is set up."""
    overrides = [arg for arg, override in zip(extra, _in_overrides(extra)) if override]
    if not overrides:
        return
    done = subprocess.run([sys.executable, "-m", "spiral_jax.cli", "config", "--config", config, *overrides],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ,
                          "JAX_PLATFORMS": "cpu"})
    if done.returncode:
        lines = done.stderr.strip().splitlines() or [f"exited with status {done.returncode}"]
        raise UsageError(f"the train arguments after `--` do not apply to {config}: "
                         f"{lines[-1].removeprefix('spiral-jax config: ')}")


def train_argv(python: str, config: str, distributed: bool, extra: list[str]) -> list[str]:
    argv = [python, "-m", "spiral_jax.cli", "train", "--config", config]
    if distributed:
        argv.append("--config.distributed.enabled=True")
    return argv + list(extra)


def start_script(workdir: str, argv: list[str], env: dict[str, str] | None = None) -> str:
    """cd to the project, refuse to start twice, then run `argv` under nohup with its own log and pid file."""
    pid = PID_FILE
    assign = "".join(f"{k}={shlex.quote(v)} " for k, v in (env or {}).items())
    return "; ".join([
        "set -e",
        f"cd {shlex.quote(workdir)}",
        f"mkdir -p {LAUNCH_DIR}",
        f'if {_running(pid)}; then echo "spiral-jax is already running '
        f'on $(hostname) (pid $(cat {pid})); stop it first with --stop" >&2; exit 1; fi',
        f"{assign}nohup {shlex.join(argv)} > {LOG_FILE} 2>&1 < /dev/null & echo $! > {pid}",
        f"sleep {CHECK_AFTER_S}",  # catch a start that fails at once (bad config key, import error)
        f'if ! kill -0 "$(cat {pid})" 2>/dev/null; then echo "spiral-jax exited at once on $(hostname); the end '
        f'of {LOG_FILE}:" >&2; tail -n 20 {LOG_FILE} >&2; exit 1; fi',
        f'echo "running on $(hostname): pid $(cat {pid}), log $PWD/{LOG_FILE}"',
    ])


def stop_script(workdir: str) -> str:
    """SIGTERM to the training process started by start_script: it saves a checkpoint and exits. A pid
    file whose process is gone or is no training run (the pid reused after a reboot) is left alone."""
    pid = PID_FILE
    return "; ".join([
        f"cd {shlex.quote(workdir)}",
        f'if {_running(pid)}; then kill "$(cat {pid})"; '
        f'echo "sent SIGTERM to pid $(cat {pid}) on $(hostname): it saves a checkpoint and exits"; '
        f'else echo "nothing running on $(hostname)"; fi',
    ])


def logs_script(workdir: str, lines: int = 50) -> str:
    return f"cd {shlex.quote(workdir)} && tail -n {lines} {LAUNCH_DIR}/train-*.log"


def is_git_url(repo: str) -> bool:
    return "://" in repo or repo.startswith("git@") or (repo.endswith(".git") and not os.path.exists(repo))


def install_script(workdir: str, git_url: str | None, ref: str, archive: str | None, python_version: str,
                   extra: str = "tpu", setup: str = "") -> str:
    """Fetch the code (git clone/fetch at `ref`, or unpack `archive`), then pip install -e '.[extra]' in a
    venv, then run `setup` (a shell command, e.g. a model download) in the project folder with the venv's
    bin on PATH. uv provides the venv's Python: TPU images ship Python 3.10, which current JAX no longer
    supports."""
    d = shlex.quote(workdir)
    steps = ["set -e", "export PIP_BREAK_SYSTEM_PACKAGES=1"]  # pip on Ubuntu 24.04 images refuses --user otherwise
    if git_url:
        # A folder there without .git holds a copied checkout (an earlier launch from a local --repo):
        # git clone refuses a folder that is not empty.
        shown = workdir if os.path.isabs(workdir) else f"~/{workdir}"
        refuse = shlex.quote(f"{shown} holds a copied checkout, not a git clone, on")
        fix = shlex.quote("pass another --remote_dir, or remove that folder on every worker first")
        steps += [f'if [ ! -d {d}/.git ] && [ -n "$(ls -A {d} 2>/dev/null)" ]; then '
                  f'echo {refuse} "$(hostname):" {fix} >&2; exit 1; fi',
                  f"if [ ! -d {d}/.git ]; then git clone -q {shlex.quote(git_url)} {d}; fi",
                  f"git -C {d} fetch -q origin {shlex.quote(ref)}",
                  f"git -C {d} checkout -q --detach FETCH_HEAD"]
    else:
        steps += [f"mkdir -p {d}", f"tar -xzf {shlex.quote(archive)} -C {d}"]
    steps += [f"cd {d}",
              "python3 -m pip install -q --user uv",
              f"if [ ! -x .venv/bin/python ]; then python3 -m uv venv -q --python {shlex.quote(python_version)} "
              f".venv; fi",
              f"python3 -m uv pip install -q --python .venv/bin/python -e {shlex.quote(f'.[{extra}]')}",
              ".venv/bin/python -c 'import socket, jax, spiral_jax; "
              "print(\"installed on\", socket.gethostname(), \"with jax\", jax.__version__)'"]
    if setup:
        steps += ['export PATH="$PWD/.venv/bin:$PATH"', setup]
    return "; ".join(steps)
