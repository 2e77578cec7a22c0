"""A training run's claim on its out_dir: one run per folder, and never two at once.

A fresh `train` refuses a folder that holds another run's files, so checkpoints, TensorBoard events
and summaries of two runs never mix (`--resume` continues that run; `--overwrite` deletes it first).
While a run trains, `out_dir/run.lock` names its process, host and start time; a second run on the
same folder refuses, naming the first. A lock left by a process that died on this host (kill -9, a
crash) is stale: it is reported and taken over. On a remote out_dir (gs://...) only the leftover-run
check applies: object stores have no atomic create, so locking them is left to the scheduler. On
several hosts every host checks for a leftover run, and only the leader locks and deletes.
"""
from __future__ import annotations

import datetime
import json
import os
import socket
from pathlib import Path

from spiral_jax.paths import is_remote, run_path

LOCK_NAME = "run.lock"
# What a run writes into out_dir; --overwrite removes exactly these.
RUN_FILES = ("checkpoints", "tensorboard", "eval", "summary.json", "config.json")


class RunDirError(ValueError):
    """out_dir belongs to another run, or another run is using it now."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def leftover_run(out_dir: str) -> str | None:
    """A description of the run already in `out_dir` ("checkpoints up to step 25, summary.json"), or
    None when the folder holds none of a run's files."""
    from spiral_jax.checkpoint import Checkpointer

    found = []
    ckpt_dir = f"{out_dir.rstrip('/')}/checkpoints"
    if is_remote(out_dir) or Path(ckpt_dir).is_dir():
        step = Checkpointer(ckpt_dir).latest_step()
        if step is not None:
            found.append(f"checkpoints up to step {step}")
    if not is_remote(out_dir):
        root = Path(out_dir)
        found += [name for name in RUN_FILES[1:]
                  if (root / name).exists() and (not (root / name).is_dir() or any((root / name).iterdir()))]
    return ", ".join(found) or None


class RunDir:
    """Context manager: check and lock `out_dir` for a training run, release the lock on exit."""

    def __init__(self, out_dir: str, *, resume: bool, overwrite: bool = False, leader: bool = True,
                 log=print):
        if resume and overwrite:
            raise RunDirError("--resume continues the run in out_dir and --overwrite deletes it; pass one")
        self.out_dir, self.resume, self.overwrite, self.leader, self.log = out_dir, resume, overwrite, leader, log
        self.lock = None if is_remote(out_dir) or not leader else Path(out_dir) / LOCK_NAME

    def __enter__(self) -> "RunDir":
        if self.lock is not None:
            self._acquire()
        try:
            self._check_leftover()
        except BaseException:
            self._release()
            raise
        import jax

        if jax.process_count() > 1:  # the other hosts start once the leader has cleared the folder
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("spiral_jax.run_dir")
        return self

    def __exit__(self, *exc) -> None:
        self._release()

    def _check_leftover(self) -> None:
        if self.resume:
            return
        leftover = leftover_run(self.out_dir)
        if leftover is None:
            return
        if not self.overwrite:
            raise RunDirError(
                f"out_dir {self.out_dir} already holds a run ({leftover}). Pass --resume to continue it, "
                f"--overwrite to delete it and start over, or --config.out_dir=NEW_FOLDER for a new run")
        if not self.leader:
            return
        for name in RUN_FILES:
            path = run_path(self.out_dir) / name
            if path.is_dir():
                path.rmtree()
            elif path.exists():
                path.unlink()
        self.log(f"--overwrite: deleted the previous run in {self.out_dir} ({leftover})")

    def _acquire(self) -> None:
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        for _ in range(2):
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            return
        raise RunDirError(f"could not lock {self.lock}: another run took it at the same moment")

    def _take_over_if_stale(self) -> None:
        try:
            holder = json.loads(self.lock.read_text())
            pid, host, started = int(holder["pid"]), str(holder["host"]), str(holder["started"])
        except (OSError, ValueError, KeyError, TypeError):
            holder = None
        if holder is None:
            raise RunDirError(f"{self.lock} exists but cannot be read; if no run uses {self.out_dir}, "
                              f"delete the file and start again")
        if host != socket.gethostname():
            raise RunDirError(
                f"out_dir {self.out_dir} is in use by process {pid} on host {host} (started {started}). "
                f"Use another out_dir; if that run is gone, delete {self.lock}")
        if _alive(pid):
            raise RunDirError(
                f"out_dir {self.out_dir} is in use by process {pid} on this host (started {started}). "
                f"Wait for it, stop it, or use another out_dir")
        self.log(f"{self.lock}: stale lock of process {pid} (started {started}, no longer running); "
                 f"taking it over")
        self.lock.unlink(missing_ok=True)

    def _release(self) -> None:
        if self.lock is None:
            return
        try:
            if json.loads(self.lock.read_text()).get("pid") == os.getpid():
                self.lock.unlink()
        except (OSError, ValueError):
            pass
