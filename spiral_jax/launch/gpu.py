"""`spiral-jax launch gpu`: one GPU host runs training here in the foreground (or over ssh when it is
remote); several hosts each start one process over ssh, with JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID set for `jax.distributed`."""
from __future__ import annotations

import os
import shlex
import sys

from spiral_jax.launch.runner import PREFIX, Runner, Step, UsageError
from spiral_jax.launch.scripts import LAUNCH_DIR, check_overrides, require_config, start_script, stop_script, train_argv


DEFAULT_PORT = 1234


def _local(host: str) -> bool:
    return host in ("localhost", "127.0.0.1", "::1")


def launch_gpu(args, extra: list[str], runner: Runner) -> int:
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]  # --hosts= is not this host
    if not hosts:
        raise UsageError("--hosts is empty; give one host or a comma-separated list (h1,h2,...)")
    if bad := [h for h in hosts if h.split() != [h] or h.startswith("@") or h.endswith("@")]:
        raise UsageError(f"--hosts: {bad[0]!r} is not a host ([user@]host); separate hosts with commas")
    if twice := next((h for i, h in enumerate(hosts) if h in hosts[:i]), None):
        raise UsageError(f"--hosts lists {twice} twice; one process runs on each host: give each once")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port; give one of 1-65535 (default {DEFAULT_PORT})")
    workdir = args.remote_dir or os.getcwd()
    # --stop on these hosts and this folder: the default folder is the current one, which a later
    # --stop from elsewhere would not find.
    stop = f"{PREFIX} gpu {shlex.join(['--hosts', args.hosts, '--remote_dir', workdir])} --stop"
    if args.stop:
        if len(hosts) == 1 and _local(hosts[0]):
            raise UsageError("a run on this host is in the foreground: stop it with Ctrl-C (it checkpoints "
                             "and exits); --stop is for runs started over ssh (--hosts)")
        runner.run_parallel([Step(["ssh", host, stop_script(workdir)], f"stop training on {host}",
                                  retry=f"rerun: {args.rerun}") for host in hosts])
        return 0
    local_single = len(hosts) == 1 and _local(hosts[0])
    if len(hosts) == 1 and (args.port is not None or args.coordinator):
        raise UsageError("--port and --coordinator set up jax.distributed across several hosts; one host "
                         "trains without a coordinator: leave them out, or list every host in --hosts")
    if local_single and not os.path.isdir(workdir):
        raise UsageError(f"--remote_dir {args.remote_dir}: no such folder here (with one local host, "
                         "training runs in it)")
    require_config(args, workdir if local_single or not args.remote_dir else None)
    if not local_single and not args.remote_dir:  # a local train reports a bad override itself, at once
        check_overrides(os.path.join(workdir, args.config), extra)
    if len(hosts) == 1:
        if _local(hosts[0]):
            python = args.python or sys.executable
            # Run in --remote_dir like a remote host would, so that its relative --config, --python and
            # out_dir are taken from there.
            cwd = None if os.path.realpath(workdir) == os.path.realpath(os.getcwd()) else os.path.abspath(workdir)
            return runner.exec(Step(train_argv(python, args.config, False, extra), "train on this host", cwd=cwd))
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
        env = {"JAX_COORDINATOR_ADDRESS": f"{coordinator}:{args.port or DEFAULT_PORT}",
               "JAX_NUM_PROCESSES": str(len(hosts)), "JAX_PROCESS_ID": str(i)}
        steps.append(Step(["ssh", host, start_script(workdir, argv, env)], f"start process {i} on {host}",
                          retry=f"stop the others (`{stop}`), check "
                                f"`ssh {host} true` and the install in {workdir}, then rerun: {args.rerun}"))
    runner.run_parallel(steps)
    if not runner.dry_run:
        print(f"[{PREFIX}] {len(hosts)} processes started; logs: {workdir}/{LAUNCH_DIR}/train-<host>.log on "
              f"each host; stop: `{stop}`", file=sys.stderr)
    return 0
