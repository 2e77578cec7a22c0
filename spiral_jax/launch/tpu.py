"""`spiral-jax launch tpu`: a Cloud TPU VM or pod slice through gcloud. The VM is created unless one
of that name exists (then it is reused, or started when stopped), the project is copied or cloned to
every worker and installed there, and training starts on all workers at once in the background."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile

from spiral_jax.hardware import TpuSlice, known_accelerators, parse_accelerator
from spiral_jax.launch.runner import PREFIX, LaunchError, Runner, Step, UsageError, failure_message
from spiral_jax.launch.scripts import (check_overrides, config_in_root, install_script, is_git_url, logs_script,
                                       require_config, start_script, stop_script, train_argv)

DEFAULT_REMOTE_DIR = "spiral_jax"


def _target(args) -> str:
    """The flags that name this launch's VM and project folder, for the --stop / --logs / --delete hints:
    without --project or --remote_dir those act on another project or folder than the launch's."""
    flags = ["--name", args.name, "--zone", args.zone]
    if args.project:
        flags += ["--project", args.project]
    if args.remote_dir != DEFAULT_REMOTE_DIR:
        flags += ["--remote_dir", args.remote_dir]
    return shlex.join(flags)


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
                          f"`{PREFIX} tpu {_target(args)} --delete`, then rerun: {args.rerun}")
    else:
        raise LaunchError(f"TPU VM {name} is {state or 'in an unknown state'}; wait until it is READY "
                          f"(`gcloud compute tpus tpu-vm describe {name} --zone={args.zone}`), then rerun: "
                          f"{args.rerun}")


def _local_root(args) -> str | None:
    """The folder a local --repo copies: its git checkout's top level (--repo . in a subfolder copies the
    whole checkout), or the folder itself outside git; None for a git URL."""
    if is_git_url(args.repo):
        return None
    if args.ref:
        raise UsageError("--ref applies to a git URL in --repo; a local checkout is copied as it is")
    src = os.path.abspath(args.repo)
    if not os.path.isdir(src):
        raise UsageError(f"--repo {args.repo!r} is neither a git URL nor a local folder")
    try:
        top = subprocess.run(["git", "-C", src, "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    except OSError:  # no git here: the pack step says that --repo must be a git checkout
        return src
    found = (top.stdout or "").strip()
    return found if top.returncode == 0 and os.path.isdir(found) else src


def _ship(runner: Runner, args, src: str | None) -> tuple[str | None, str | None]:
    """(git url, remote archive path): a git URL is cloned on the workers; a local checkout `src` is packed
    (tracked and untracked, non-ignored files) and copied to every worker, to a file in the home folder
    (a nested --remote_dir's parent folders do not exist yet on a fresh VM)."""
    if src is None:
        return args.repo, None
    archive = os.path.join(tempfile.gettempdir(), f"spiral_jax-{args.name}.tgz")
    remote = args.remote_dir.strip("/").replace("/", "_") + ".tgz"
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
    if not name.strip() or not args.zone.strip():
        raise UsageError("--name and --zone need a value: the TPU VM's name and its zone")
    if sum((args.delete, args.stop, args.logs)) > 1:
        raise UsageError("pass one of --stop, --logs and --delete")
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
    src = _local_root(args)
    require_config(args, None)
    config = config_in_root(args.config, src, os.getcwd()) if src else args.config
    if src is None and (os.path.isabs(config) or config.startswith("~") or ".." in config.split("/")):
        raise UsageError(f"--config {config}: with --repo URL the workers read the config from their clone "
                         f"of the repository, so give its path inside it (e.g. configs/X.py)")
    if src:
        check_overrides(os.path.join(src, config), extra)

    _ensure_vm(runner, args, tpu)
    git_url, archive = _ship(runner, args, src)
    install = install_script(args.remote_dir, git_url, args.ref or "HEAD", archive, args.python_version,
                             setup=args.setup or "")
    one = shlex.join(_ssh(name, args, install, worker="0"))
    runner.run(Step(_ssh(name, args, install), "install the project on every worker",
                    retry=f"gcloud names the worker that failed; rerun that one with `{one}` (change "
                          f"--worker=0 to its number), or rerun the launch (the VM is reused): {args.rerun}"))
    multi = tpu.hosts > 1
    argv = train_argv(".venv/bin/python", config, multi, extra)
    runner.run(Step(_ssh(name, args, start_script(args.remote_dir, argv)),
                    f"start training on {'all ' + str(tpu.hosts) + ' workers' if multi else 'the worker'}",
                    retry=f"if some workers started and others did not, stop them all with `{PREFIX} tpu "
                          f"{_target(args)} --stop`, then rerun: {args.rerun}"))
    if not runner.dry_run:
        where = f"{PREFIX} tpu {_target(args)}"
        print(f"[{PREFIX}] training runs in the background on {tpu.hosts} worker(s); logs: `{where} --logs`; "
              f"stop: `{where} --stop`; delete the VM: `{where} --delete`", file=sys.stderr)
    return 0
