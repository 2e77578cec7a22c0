"""`spiral-jax launch`: start the same `spiral-jax train` on every host of a Cloud TPU slice or GPU cluster.

    spiral-jax launch tpu --name N --zone Z --accelerator v5p-8 --config configs/X.py [-- train args]
    spiral-jax launch tpu --name N --zone Z --stop | --logs | --delete
    spiral-jax launch gpu --hosts h1,h2 [--port 1234] --config configs/X.py [-- train args]
    spiral-jax launch gpu --hosts h1,h2 --stop

`tpu` creates the TPU VM or pod slice with gcloud unless one of that name exists (then it is reused),
copies the project to every worker (`--repo`: this checkout by default, or a git URL cloned at
`--ref`), installs it in `<remote-dir>/.venv` with `pip install -e '.[tpu]'`, and starts training on
all workers at once in the background; each worker logs to `<remote-dir>/runs/launch/train-<host>.log`.
Slices with more than one host get `--config.distributed.enabled=True` (JAX finds the other workers
by itself on TPU). `gpu` runs the command here for one local host, else over ssh on each host with
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID set for `jax.distributed`.
`--dry_run` prints every command, one per line, shell-quoted, and runs nothing.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from spiral_jax.hardware import TpuSlice, known_accelerators, parse_accelerator

PREFIX = "spiral-jax launch"
LAUNCH_DIR = "runs/launch"  # under the remote project folder; runs/ is git-ignored, so never overwritten
# Expanded by the remote shell: one of each per host, also when hosts share the folder (NFS home).
PID_FILE = f"{LAUNCH_DIR}/train-$(hostname).pid"
LOG_FILE = f"{LAUNCH_DIR}/train-$(hostname).log"
CHECK_AFTER_S = 10  # after starting, wait this long and report a process that already died


class LaunchError(Exception):
    """A launch step that cannot go on; the message says what failed and how to retry."""


class UsageError(LaunchError):
    """Bad command-line arguments (exit status 2)."""


# ---------------------------------------------------------------------------------------------------
# Running commands.


@dataclass
class Step:
    argv: list[str]
    what: str                 # "create the TPU VM", "install on every worker", ...
    retry: str = ""           # how to retry when it fails
    note: str = ""            # printed after the command in --dry_run, as a shell comment

    def line(self) -> str:
        text = shlex.join(self.argv)
        return f"{text}  # {self.note}" if self.note else text


_INSTALL_HINTS = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then run "
              "`gcloud auth login` and `gcloud config set project PROJECT`",
    "ssh": "install an OpenSSH client and set up key-based ssh to every host",
}


@dataclass
class Runner:
    """Runs steps with subprocess, or prints them (dry run). Tests swap in a fake."""
    dry_run: bool = False
    out: object = None

    def _print(self, text: str) -> None:
        print(text, file=self.out or sys.stdout, flush=True)

    def _check_tool(self, step: Step) -> None:
        tool = step.argv[0]
        if shutil.which(tool) is None:
            hint = _INSTALL_HINTS.get(os.path.basename(tool), f"install {tool} or put it on PATH")
            raise LaunchError(f"cannot {step.what}: `{tool}` is not on PATH; {hint}")

    def run(self, step: Step, capture: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        if self.dry_run:
            self._print(step.line())
            return subprocess.CompletedProcess(step.argv, 0, "", "")
        self._check_tool(step)
        print(f"[{PREFIX}] {step.what}: {step.line()}", file=sys.stderr, flush=True)
        proc = subprocess.run(step.argv, text=True, capture_output=capture)
        if check and proc.returncode != 0:
            raise LaunchError(failure_message(step, proc))
        return proc

    def run_parallel(self, steps: list[Step]) -> None:
        """All steps at once (one ssh per host: a coordinator waits only so long for the others);
        then one error naming every step that failed."""
        if self.dry_run:
            for step in steps:
                self.run(step)
            return
        for step in steps:
            self._check_tool(step)
            print(f"[{PREFIX}] {step.what}: {step.line()}", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(max_workers=min(len(steps), 64) or 1) as pool:
            procs = list(pool.map(lambda st: subprocess.run(st.argv, text=True, capture_output=False), steps))
        failed = [failure_message(st, p) for st, p in zip(steps, procs) if p.returncode != 0]
        if failed:
            raise LaunchError(f"{len(failed)} of {len(steps)} failed:\n" + "\n".join(failed))

    def exec(self, step: Step) -> int:
        """Replace this process by the step (a foreground run keeps Ctrl-C / SIGTERM semantics)."""
        if self.dry_run:
            self._print(step.line())
            return 0
        self._check_tool(step)
        print(f"[{PREFIX}] {step.what}: {step.line()}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os.execvp(step.argv[0], step.argv)
        return 0  # not reached


def failure_message(step: Step, proc: subprocess.CompletedProcess) -> str:
    lines = [f"step failed: {step.what} (exit status {proc.returncode})", f"  command: {step.line()}"]
    err = (proc.stderr or "").strip()
    if err:
        lines.append("  stderr: " + "\n          ".join(err.splitlines()[-12:]))
    if step.retry:
        lines.append(f"  retry: {step.retry}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# Shell scripts run on the hosts. Everything user-given is shlex-quoted; $(hostname) and $! are not.


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
        f'if [ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null; then echo "spiral-jax is already running '
        f'on $(hostname) (pid $(cat {pid})); stop it first with --stop" >&2; exit 1; fi',
        f"{assign}nohup {shlex.join(argv)} > {LOG_FILE} 2>&1 < /dev/null & echo $! > {pid}",
        f"sleep {CHECK_AFTER_S}",  # catch a start that fails at once (bad config key, import error)
        f'if ! kill -0 "$(cat {pid})" 2>/dev/null; then echo "spiral-jax exited at once on $(hostname); the end '
        f'of {LOG_FILE}:" >&2; tail -n 20 {LOG_FILE} >&2; exit 1; fi',
        f'echo "running on $(hostname): pid $(cat {pid}), log $PWD/{LOG_FILE}"',
    ])


def stop_script(workdir: str) -> str:
    """SIGTERM to the training process started by start_script: it saves a checkpoint and exits."""
    pid = PID_FILE
    return "; ".join([
        f"cd {shlex.quote(workdir)}",
        f'if [ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null; then kill "$(cat {pid})"; '
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
        steps += [f"if [ ! -d {d}/.git ]; then git clone -q {shlex.quote(git_url)} {d}; fi",
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


# ---------------------------------------------------------------------------------------------------
# tpu


def _scope(args) -> list[str]:
    return [f"--zone={args.zone}"] + ([f"--project={args.project}"] if args.project else [])


def _gcloud_tpu(verb: str, name: str, args) -> list[str]:
    return ["gcloud", "compute", "tpus", "tpu-vm", verb, name, *_scope(args)]


def _ssh(name: str, args, command: str, worker: str = "all") -> list[str]:
    return _gcloud_tpu("ssh", name, args) + [f"--worker={worker}", f"--command={command}"]


def _ensure_vm(runner: Runner, args, tpu: TpuSlice) -> None:
    """Reuse an existing VM of that name (start it if stopped), else create it."""
    name = args.name
    describe = Step(_gcloud_tpu("describe", name, args) + ["--format=value(state,acceleratorType)"],
                    f"look up TPU VM {name}")
    create_argv = _gcloud_tpu("create", name, args) + [f"--accelerator-type={tpu.accelerator}",
                                                       f"--version={args.runtime_version or tpu.runtime}"]
    if args.spot:
        create_argv.append("--spot")
    create = Step(create_argv, f"create TPU VM {name} ({tpu.accelerator}, {tpu.hosts} host(s))",
                  retry=f"no capacity or quota for {tpu.accelerator} in {args.zone}? try another zone, "
                        f"--spot, or a smaller slice, then rerun: {args.rerun}",
                  note=f"only when describe finds no TPU VM named {name}")
    found = runner.run(describe, capture=True, check=False)
    if runner.dry_run:
        runner.run(create)
        return
    if found.returncode != 0:
        err = (found.stderr or "") + (found.stdout or "")
        if "NOT_FOUND" not in err and "not found" not in err.lower():
            raise LaunchError(failure_message(describe, found) + "\n  retry: check `gcloud auth list`, the "
                              "project (--project) and the zone, then rerun: " + args.rerun)
        runner.run(create)
        return
    state, _, existing = (found.stdout or "").strip().partition("\t")
    existing = existing.strip().rsplit("/", 1)[-1]
    if existing and existing != tpu.accelerator:
        raise LaunchError(f"TPU VM {name} exists in {args.zone} as {existing}, not {tpu.accelerator}: use "
                          f"--accelerator {existing}, another --name, or delete it (--delete) first")
    if state == "READY":
        print(f"[{PREFIX}] reusing TPU VM {name} ({existing or tpu.accelerator}, READY)", file=sys.stderr)
    elif state == "STOPPED":
        runner.run(Step(_gcloud_tpu("start", name, args), f"start the stopped TPU VM {name}",
                        retry=f"rerun: {args.rerun}"))
    elif state in ("PREEMPTED", "TERMINATED"):
        raise LaunchError(f"TPU VM {name} is {state} and cannot be restarted: delete it with "
                          f"`{PREFIX} tpu --name {name} --zone {args.zone} --delete`, then rerun: {args.rerun}")
    else:
        raise LaunchError(f"TPU VM {name} is {state or 'in an unknown state'}; wait until it is READY "
                          f"(`gcloud compute tpus tpu-vm describe {name} --zone={args.zone}`), then rerun: "
                          f"{args.rerun}")


def _ship(runner: Runner, args) -> tuple[str | None, str | None]:
    """(git url, remote archive path): a git URL is cloned on the workers; a local checkout is packed
    (tracked and untracked, non-ignored files) and copied to every worker."""
    if is_git_url(args.repo):
        return args.repo, None
    if args.ref:
        raise UsageError("--ref applies to a git URL in --repo; a local checkout is copied as it is")
    src = os.path.abspath(args.repo)
    if not os.path.isdir(src):
        raise UsageError(f"--repo {args.repo!r} is neither a git URL nor a local folder")
    archive = os.path.join(tempfile.gettempdir(), f"spiral_jax-{args.name}.tgz")
    remote = f"{args.remote_dir.rstrip('/')}.tgz"
    pack = (f"set -o pipefail; git -C {shlex.quote(src)} ls-files -z -co --exclude-standard | "
            f"tar -C {shlex.quote(src)} --null --ignore-failed-read -T - -czf {shlex.quote(archive)}")
    runner.run(Step(["bash", "-c", pack], f"pack the checkout {src}",
                    retry=f"--repo must be a git checkout; rerun: {args.rerun}"))
    copy = ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive, f"{args.name}:{remote}", *_scope(args),
            "--worker=all"]
    runner.run(Step(copy, "copy the code to every worker",
                    retry="gcloud names the worker that failed; rerun the launch (the VM is reused): "
                          + args.rerun))
    return None, remote


def launch_tpu(args, extra: list[str], runner: Runner) -> int:
    name = args.name
    if args.delete:
        runner.run(Step(_gcloud_tpu("delete", name, args), f"delete TPU VM {name}",
                        retry=f"rerun: {args.rerun}"))
        return 0
    if args.stop:
        runner.run(Step(_ssh(name, args, stop_script(args.remote_dir)), f"stop training on every worker of {name}",
                        retry=f"rerun: {args.rerun}"))
        return 0
    if args.logs:
        runner.run(Step(_ssh(name, args, logs_script(args.remote_dir), worker="0"), "show worker 0's log",
                        retry=f"rerun: {args.rerun}"))
        return 0
    if not args.accelerator:
        raise UsageError("--accelerator is required (e.g. --accelerator v5p-8); known: " + known_accelerators())
    try:
        tpu = parse_accelerator(args.accelerator)
    except ValueError as e:
        raise UsageError(str(e)) from None
    _require_config(args, os.path.abspath(args.repo) if not is_git_url(args.repo) else None)

    _ensure_vm(runner, args, tpu)
    git_url, archive = _ship(runner, args)
    install = install_script(args.remote_dir, git_url, args.ref or "HEAD", archive, args.python_version,
                             setup=args.setup or "")
    one = shlex.join(_ssh(name, args, install, worker="0"))
    runner.run(Step(_ssh(name, args, install), "install the project on every worker",
                    retry=f"gcloud names the worker that failed; rerun that one with `{one}` (change "
                          f"--worker=0 to its number), or rerun the launch (the VM is reused): {args.rerun}"))
    multi = tpu.hosts > 1
    argv = train_argv(".venv/bin/python", args.config, multi, extra)
    runner.run(Step(_ssh(name, args, start_script(args.remote_dir, argv)),
                    f"start training on {'all ' + str(tpu.hosts) + ' workers' if multi else 'the worker'}",
                    retry=f"if some workers started and others did not, stop them all with `{PREFIX} tpu "
                          f"--name {name} --zone {args.zone} --stop`, then rerun: {args.rerun}"))
    if not runner.dry_run:
        where = f"--name {name} --zone {args.zone}" + (f" --project {args.project}" if args.project else "")
        print(f"[{PREFIX}] training runs in the background on {tpu.hosts} worker(s); logs: "
              f"`{PREFIX} tpu {where} --logs`; stop: `... --stop`; delete the VM: `... --delete`",
              file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------
# gpu


def _local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1")


def launch_gpu(args, extra: list[str], runner: Runner) -> int:
    hosts = [h.strip() for h in (args.hosts or "localhost").split(",") if h.strip()]
    if not hosts:
        raise UsageError("--hosts is empty; give one host or a comma-separated list (h1,h2,...)")
    workdir = args.remote_dir or os.getcwd()
    if args.stop:
        if len(hosts) == 1 and _local(hosts[0]):
            raise UsageError("a run on this host is in the foreground: stop it with Ctrl-C (it checkpoints "
                             "and exits); --stop is for runs started over ssh (--hosts)")
        runner.run_parallel([Step(["ssh", host, stop_script(workdir)], f"stop training on {host}",
                                  retry=f"rerun: {args.rerun}") for host in hosts])
        return 0
    local_single = len(hosts) == 1 and _local(hosts[0])
    _require_config(args, os.getcwd() if local_single or not args.remote_dir else None)
    if len(hosts) == 1:
        if _local(hosts[0]):
            python = args.python or sys.executable
            return runner.exec(Step(train_argv(python, args.config, False, extra), "train on this host"))
        argv = train_argv(args.python or "python3", args.config, False, extra)
        runner.run(Step(["ssh", hosts[0], start_script(workdir, argv)], f"start training on {hosts[0]}",
                        retry=f"check `ssh {hosts[0]} true` and that the project is installed in {workdir}, "
                              f"then rerun: {args.rerun}"))
        return 0
    coordinator = args.coordinator or hosts[0].rsplit("@", 1)[-1]
    if _local(coordinator):
        raise UsageError(f"the coordinator ({coordinator}, the first of --hosts) must be an address every "
                         "host can reach; use its hostname or IP, or pass --coordinator")
    argv = train_argv(args.python or "python3", args.config, True, extra)
    steps = []
    for i, host in enumerate(hosts):
        env = {"JAX_COORDINATOR_ADDRESS": f"{coordinator}:{args.port}",
               "JAX_NUM_PROCESSES": str(len(hosts)), "JAX_PROCESS_ID": str(i)}
        steps.append(Step(["ssh", host, start_script(workdir, argv, env)], f"start process {i} on {host}",
                          retry=f"stop the others (`{PREFIX} gpu --hosts {args.hosts} --stop`), check "
                                f"`ssh {host} true` and the install in {workdir}, then rerun: {args.rerun}"))
    runner.run_parallel(steps)
    if not runner.dry_run:
        print(f"[{PREFIX}] {len(hosts)} processes started; logs: {workdir}/{LAUNCH_DIR}/train-<host>.log on "
              f"each host; stop: `{PREFIX} gpu --hosts {args.hosts} --stop`", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------------
# command line


def _require_config(args, local_root: str | None) -> None:
    if not args.config:
        raise UsageError("--config is required (e.g. --config configs/mesh_tpu_v4_8.py); train arguments "
                         "go after `--`")
    if local_root and not os.path.isabs(args.config) and not os.path.exists(os.path.join(local_root, args.config)):
        raise UsageError(f"--config {args.config}: no such file in {local_root}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PREFIX, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Train arguments (config overrides, --resume) go after `--`.")
    sub = p.add_subparsers(dest="target", required=True, metavar="{tpu,gpu}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="config file, relative to the project root (configs/X.py)")
    common.add_argument("--dry_run", "--dry-run", action="store_true", help="print the commands, run nothing")
    common.add_argument("--stop", action="store_true",
                        help="stop the training started by a launch (SIGTERM: it checkpoints and exits)")

    t = sub.add_parser("tpu", parents=[common], help="a Cloud TPU VM or pod slice (v4, v5e, v5p, v6e)")
    t.add_argument("--name", required=True, help="TPU VM name (created unless it exists)")
    t.add_argument("--zone", required=True,
                   help="e.g. us-central2-b (v4), us-west4-a (v5e), us-east5-a (v5p), us-east1-d (v6e)")
    t.add_argument("--accelerator", help="accelerator type: " + known_accelerators())
    t.add_argument("--project", help="Google Cloud project (default: gcloud's configured one)")
    t.add_argument("--spot", action="store_true", help="create a Spot TPU VM")
    t.add_argument("--runtime_version", "--runtime-version", help="override the TPU software version picked for the generation")
    t.add_argument("--repo", default=".", help="a local checkout to copy (default: .) or a git URL to clone")
    t.add_argument("--ref", help="branch, tag or commit to check out (with a git URL; default: its HEAD)")
    t.add_argument("--remote_dir", "--remote-dir", default="spiral_jax", help="project folder on the workers, relative to "
                   "the home folder (default: spiral_jax)")
    t.add_argument("--python_version", "--python-version", default="3.11", help="Python of the workers' venv (default: 3.11)")
    t.add_argument("--setup", help="shell command run on every worker after the install, in the project "
                   "folder with the venv on PATH (e.g. a model download: 'hf download Qwen/Qwen3-4B-Base "
                   "--local-dir ckpt/Qwen3-4B-Base')")
    t.add_argument("--logs", action="store_true", help="show the end of worker 0's training log")
    t.add_argument("--delete", action="store_true", help="delete the TPU VM (gcloud asks to confirm)")

    g = sub.add_parser("gpu", parents=[common], help="one or more GPU hosts (over ssh)")
    g.add_argument("--hosts", default="localhost", help="comma-separated hosts, [user@]host; the first runs "
                   "the coordinator (default: localhost, run here)")
    g.add_argument("--port", type=int, default=1234, help="coordinator port on the first host (default: 1234)")
    g.add_argument("--coordinator", help="coordinator host as the other hosts reach it (default: first host)")
    g.add_argument("--remote_dir", "--remote-dir", help="project folder on the hosts (default: this folder's absolute path)")
    g.add_argument("--python", help="Python with the project installed, run in --remote-dir (default: "
                   "python3 on remote hosts, this Python locally; e.g. .venv/bin/python)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = _parser()
    try:
        args, unknown = parser.parse_known_args(own)
    except SystemExit as e:  # argparse already printed the usage and the error
        return int(e.code or 0)
    if unknown:
        print(f"{PREFIX}: unrecognized arguments: {shlex.join(unknown)}; train arguments go after `--`, "
              f"e.g. {PREFIX} tpu ... -- --config.train.steps=100", file=sys.stderr)
        return 2
    args.rerun = shlex.join(["spiral-jax", "launch", *argv])
    runner = Runner(dry_run=args.dry_run)
    try:
        return (launch_tpu if args.target == "tpu" else launch_gpu)(args, extra, runner)
    except UsageError as e:
        print(f"{PREFIX} {args.target}: {e}", file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"{PREFIX} {args.target}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
