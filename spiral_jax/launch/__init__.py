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

Here: the command line. `tpu.py` and `gpu.py` launch on each target, `scripts.py` holds the train command
and the shell scripts run on the hosts, `runner.py` runs (or prints) each step.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from spiral_jax.hardware import known_accelerators, parse_accelerator
from spiral_jax.launch.gpu import DEFAULT_PORT, launch_gpu
from spiral_jax.launch.runner import PREFIX, LaunchError, Runner, Step, UsageError, failure_message
from spiral_jax.launch.scripts import (LAUNCH_DIR, LOG_FILE, PID_FILE, check_train_args, install_script, is_git_url,
                                       logs_script, start_script, stop_script, train_argv)
from spiral_jax.launch.tpu import DEFAULT_REMOTE_DIR, launch_tpu

__all__ = ["LAUNCH_DIR", "LOG_FILE", "PID_FILE", "PREFIX", "LaunchError", "Runner", "Step", "UsageError",
           "failure_message", "install_script", "is_git_url", "launch_gpu", "launch_tpu", "logs_script", "main",
           "parse_accelerator", "start_script", "stop_script", "train_argv"]


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
    t.add_argument("--remote_dir", "--remote-dir", default=DEFAULT_REMOTE_DIR, help="project folder on the workers, "
                   f"relative to the home folder (default: {DEFAULT_REMOTE_DIR})")
    t.add_argument("--python_version", "--python-version", default="3.11", help="Python of the workers' venv (default: 3.11)")
    t.add_argument("--setup", help="shell command run on every worker after the install, in the project "
                   "folder with the venv on PATH (e.g. a model download: 'hf download Qwen/Qwen3-4B-Base "
                   "--local-dir ckpt/Qwen3-4B-Base')")
    t.add_argument("--logs", action="store_true", help="show the end of worker 0's training log")
    t.add_argument("--delete", action="store_true", help="delete the TPU VM (gcloud asks to confirm)")

    g = sub.add_parser("gpu", parents=[common], help="one or more GPU hosts (over ssh)")
    g.add_argument("--hosts", default="localhost", help="comma-separated hosts, [user@]host; the first runs "
                   "the coordinator (default: localhost, run here)")
    g.add_argument("--port", type=int, help=f"coordinator port on the first host, with several hosts (default: "
                   f"{DEFAULT_PORT})")
    g.add_argument("--coordinator", help="coordinator host as the other hosts reach it, with several hosts "
                   "(default: first host)")
    g.add_argument("--remote_dir", "--remote-dir", help="project folder on the hosts, where training runs (default: "
                   "this folder's absolute path)")
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
        check_train_args(extra)  # here, not on the hosts after a VM is made and the project installed
        return (launch_tpu if args.target == "tpu" else launch_gpu)(args, extra, runner)
    except UsageError as e:
        print(f"{PREFIX} {args.target}: {e}", file=sys.stderr)
        return 2
    except LaunchError as e:
        print(f"{PREFIX} {args.target}: {e}", file=sys.stderr)
        return 1
