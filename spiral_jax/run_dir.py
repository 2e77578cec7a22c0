"""A training run's claim on its out_dir: one run per folder, never two at once, and never a
deletion of files a run did not write.

A fresh `train` refuses a folder that holds another run's files, so checkpoints, TensorBoard events
and summaries of two runs never mix (`--resume` continues that run; `--overwrite` deletes it first).
A fresh run writes `out_dir/run_manifest.json`, the entries it owns; `--overwrite` deletes exactly
those, and refuses a folder without a manifest (files that merely have a run's names, such as a
user's config.json, are never deleted). `spiral-jax export` does the same with `export_manifest.json`
in its --out folder (export.py), and refuses the folders this module guards, as a run does.

While a run trains, `out_dir/run.lock` names its process, host, start time and a token of its own;
a second run on the same folder refuses, naming the first. The lock appears whole and at once (written
to a temporary file, then hard-linked into place, which fails if a lock exists). A lock left by a
process that died on this host (kill -9, a crash) is stale: it is reported and taken over, by one run
only: a run deletes a stale lock only after creating `run.lock.takeover-<hash of that lock>` with
O_EXCL and re-reading the lock unchanged, so two runs taking over at once cannot both hold it. On a
remote out_dir (gs://...) only the leftover-run and resume checks apply: object stores have no atomic create,
so locking them is left to the scheduler. On several hosts every host checks for a leftover run, and
only the leader locks and deletes.
"""
from __future__ import annotations

import datetime
import errno
import hashlib
import json
import os
import socket
import time
import uuid
from pathlib import Path

from spiral_jax.paths import is_remote, replace_text, run_path

LOCK_NAME = "run.lock"
MANIFEST_NAME = "run_manifest.json"
# What a run writes into out_dir, which its manifest lists.
RUN_FILES = ("checkpoints", "tensorboard", "eval", "summary.json", "config.json")


class RunDirError(ValueError):
    """out_dir belongs to another run, another run is using it now, or it cannot be written."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _present(root, names) -> list[str]:
    """Those of `names` in `root` that hold something (a file, or a folder that is not empty)."""
    found = []
    for name in names:
        path = root / name
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            found.append(name)
    return found


def newest_checkpoint(out_dir: str) -> int | None:
    """The newest step orbax finds in out_dir/checkpoints (in a bucket too), or None; a local folder
    without checkpoints/ is left as it is."""
    from spiral_jax.checkpoint import Checkpointer

    ckpt_dir = f"{out_dir.rstrip('/')}/checkpoints"
    if not is_remote(out_dir) and not Path(ckpt_dir).is_dir():
        return None
    ckpt = Checkpointer(ckpt_dir)
    step = ckpt.latest_step()
    ckpt.close()
    return step


def leftover_run(out_dir: str) -> str | None:
    """A description of the run already in `out_dir` ("checkpoints up to step 25, summary.json"), or
    None when the folder holds none of a run's files."""
    step = newest_checkpoint(out_dir)
    found = [] if step is None else [f"checkpoints up to step {step}"]
    found += _present(run_path(out_dir), RUN_FILES[1:])
    return ", ".join(found) or None


def read_manifest(folder, name: str = MANIFEST_NAME) -> list[str] | None:
    """The entries a manifest in `folder` lists, or None without one. Each entry is a plain name in
    `folder` (a manifest naming anything else is refused, not followed)."""
    path = run_path(folder) / name
    if not path.exists():
        return None
    try:
        entries = json.loads(path.read_text())["entries"]
    except (ValueError, KeyError, TypeError) as e:
        raise RunDirError(f"{path} cannot be read ({e}); delete the folder's contents yourself or choose "
                          f"another folder") from None
    if not isinstance(entries, list):  # a string would be read as its letters, each a name to delete
        raise RunDirError(f"{path} lists no entries (its 'entries' is not a list); "
                          f"nothing was deleted: delete the folder's contents yourself or choose another folder")
    bad = [e for e in entries if not isinstance(e, str) or e in ("", ".", "..") or "/" in e or "\\" in e]
    if bad:
        raise RunDirError(f"{path} lists {bad!r}, which are not names of entries in {folder}; nothing was "
                          f"deleted: delete the folder's contents yourself or choose another folder")
    return list(entries)


def write_manifest(folder, entries, name: str = MANIFEST_NAME, written_by: str = "spiral-jax train") -> None:
    replace_text(run_path(folder) / name,  # whole or not at all: a half-written manifest blocks --overwrite
                 json.dumps({"written_by": written_by, "entries": sorted(entries),
                             "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds")},
                            indent=1) + "\n")


def delete_listed(folder, entries) -> list[str]:
    """Delete each listed entry of `folder` that exists; the names deleted."""
    deleted = []
    for name in entries:
        path = run_path(folder) / name
        if path.is_dir() and not os.path.islink(path):  # a link is deleted, never what it points to
            path.rmtree()
        elif path.exists():
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted


def unwritable(folder: str, error: OSError) -> RunDirError:
    """The one-line error for a folder that cannot be created or written."""
    reason = error.strerror or str(error)
    if isinstance(error, (NotADirectoryError, FileExistsError)) or error.errno in (errno.ENOTDIR, errno.EEXIST):
        reason = "a file is in the way (a part of the path is a file, not a folder)"
    elif isinstance(error, IsADirectoryError) and error.filename:  # a folder named as a file the run writes
        reason = f"{error.filename} is a folder where spiral-jax keeps a file; move it away"
    return RunDirError(f"cannot write to {folder}: {reason}. Choose a folder you can write, e.g. "
                       f"--config.out_dir=runs/NEW_NAME")


RESUME_AND_OVERWRITE = "--resume continues the run in out_dir and --overwrite deletes it; pass one"


class RunDir:
    """Context manager: check and lock `out_dir` for a training run, release the lock on exit."""

    def __init__(self, out_dir: str, *, resume: bool, overwrite: bool = False, leader: bool = True,
                 log=print):
        if resume and overwrite:
            raise RunDirError(RESUME_AND_OVERWRITE)
        if not is_remote(out_dir):
            if taken := guarded_by(resolved(out_dir).resolve(), shared_folders()):
                raise RunDirError(f"out_dir {out_dir} is {taken}; give the run a folder of its own, e.g. "
                                  f"--config.out_dir=runs/NAME")
        self.out_dir, self.resume, self.overwrite, self.leader, self.log = out_dir, resume, overwrite, leader, log
        self.lock = None if is_remote(out_dir) or not leader else Path(out_dir) / LOCK_NAME
        self.token = uuid.uuid4().hex  # tells this claim's lock from any other, in this process too

    def __enter__(self) -> "RunDir":
        if self.resume and not self._resumable():  # before the model is built and its weights load
            raise RunDirError(f"no checkpoint to resume from in {self.out_dir.rstrip('/')}/checkpoints; leave out "
                              f"--resume to start a new run, or give the run's folder as --config.out_dir")
        if self.lock is not None:
            try:
                self.acquire()
            except RunDirError:
                raise
            except OSError as e:  # a read-only disk, a path through a file, no permission
                raise unwritable(self.out_dir, e) from None
        try:
            self._check_leftover()
            if not self.resume and self.leader:  # from now on, what this run writes is listed as its own
                run_path(self.out_dir).mkdir(parents=True, exist_ok=True)
                write_manifest(self.out_dir, RUN_FILES)
        except OSError as e:
            self.release()
            raise unwritable(self.out_dir, e) from None
        except BaseException:
            self.release()
            raise
        import jax

        if jax.process_count() > 1:  # the other hosts start once the leader has cleared the folder
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("spiral_jax.run_dir")
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _resumable(self) -> bool:
        """Whether out_dir holds a checkpoint to resume from: in a bucket, a step orbax lists (every host
        reads it); in a local folder, checked by the leader, a step's folder or its previous version kept
        while it was saved again (the Checkpointer restores that one when the new save never completed)."""
        if is_remote(self.out_dir):
            return newest_checkpoint(self.out_dir) is not None
        checkpoints = Path(self.out_dir) / "checkpoints"
        return self.lock is None or checkpoints.is_dir() and any(
            p.name.removesuffix(".replaced").isdigit() for p in checkpoints.iterdir())

    def _check_leftover(self) -> None:
        if self.resume:
            return
        leftover = leftover_run(self.out_dir)
        if leftover is None:
            return
        listed = read_manifest(self.out_dir)
        if listed is None:
            raise RunDirError(
                f"out_dir {self.out_dir} holds files a run writes ({leftover}) but no {MANIFEST_NAME}, so they "
                f"may not be a run's, and nothing was deleted"
                + (" (--overwrite deletes only what a run's manifest lists)" if self.overwrite else "")
                + ". Choose another folder (--config.out_dir=NEW_FOLDER), or move those files yourself"
                + ("; --resume continues a run whose checkpoints are there" if "checkpoints" in leftover else ""))
        if not self.overwrite:
            raise RunDirError(
                f"out_dir {self.out_dir} already holds a run ({leftover}). Pass --resume to continue it, "
                f"--overwrite to delete it and start over, or --config.out_dir=NEW_FOLDER for a new run")
        if not self.leader:
            return
        delete_listed(self.out_dir, listed)
        self.log(f"--overwrite: deleted the previous run in {self.out_dir} ({leftover}): "
                 f"{', '.join(listed)} as its {MANIFEST_NAME} lists; nothing else")

    # ------------------------------------------------------------------------------------ lock

    def acquire(self) -> None:
        """Take out_dir's lock (`__enter__` does, after its checks); RunDirError when a live process
        holds it. A stale lock is taken over by one claimant only."""
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "token": self.token,
                             "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")})
        for attempt in range(200):
            if self._create(record):
                return
            try:
                text = self.lock.read_text(errors="replace")  # not UTF-8: a lock that cannot be read
            except FileNotFoundError:  # released or taken over in between: try again
                continue
            self._take_over_if_stale(text, attempt)
        raise RunDirError(f"could not lock {self.lock}: other runs keep taking it; if no run uses "
                          f"{self.out_dir}, delete {self.lock} and {self.lock}.takeover-* and start again")

    def _create(self, record: str) -> bool:
        """Make the lock hold `record`, whole, if there is none: True when this call made it."""
        tmp = self.lock.with_name(f"{LOCK_NAME}.{self.token}.tmp")
        tmp.write_text(record)
        try:
            os.link(tmp, self.lock)
            return True
        except FileExistsError:
            return False
        except OSError as e:  # file systems without hard links: an exclusive create, then the record
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                raise
            try:
                fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                f.write(record)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _take_over_if_stale(self, text: str, attempt: int) -> None:
        """Raise when the lock `text` (read from run.lock) belongs to a live or unknown run; delete it
        when its process is gone, unless another run is taking it over (then the caller tries again)."""
        try:
            holder = json.loads(text)
            pid, host, started = int(holder["pid"]), str(holder["host"]), str(holder["started"])
            if not 0 < pid < 2 ** 31:  # no process's id (os.kill would signal a group, or overflow)
                raise ValueError(pid)
        except (ValueError, KeyError, TypeError):
            if not text and attempt < 20:  # an exclusive create whose record is not written yet
                time.sleep(0.01)
                return
            raise RunDirError(f"{self.lock} exists but cannot be read; if no run uses {self.out_dir}, "
                              f"delete the file and start again") from None
        if host != socket.gethostname():
            raise RunDirError(
                f"out_dir {self.out_dir} is in use by process {pid} on host {host} (started {started}). "
                f"Use another out_dir; if that run is gone, delete {self.lock}")
        if _alive(pid):
            raise RunDirError(
                f"out_dir {self.out_dir} is in use by process {pid} on this host (started {started}). "
                f"Wait for it, stop it, or use another out_dir")
        claim = self.lock.with_name(f"{LOCK_NAME}.takeover-{hashlib.sha256(text.encode()).hexdigest()[:16]}")
        try:
            os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:  # another run is replacing this very lock: see what it leaves
            time.sleep(0.01)
            return
        try:
            try:
                unchanged = self.lock.read_text(errors="replace") == text
            except FileNotFoundError:
                unchanged = False
            if unchanged:  # only the holder of `claim` deletes this lock, so it is still the stale one
                self.lock.unlink()
                self.log(f"{self.lock}: stale lock of process {pid} (started {started}, no longer running); "
                         f"taking it over")
        finally:
            claim.unlink(missing_ok=True)

    def release(self) -> None:
        """Give the lock back, if this claim holds it."""
        if self.lock is None:
            return
        try:
            if json.loads(self.lock.read_text()).get("token") == self.token:
                self.lock.unlink()
        except (OSError, ValueError, AttributeError):
            pass


def resolved(path) -> Path:
    """`path` made absolute, `~` expanded, links left as they are."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def shared_folders() -> dict[str, Path]:
    """Folders no run or export may take as its own (it writes and, with --overwrite, clears files
    there): the current folder and the home folder, and by that their parents."""
    return {"the current folder": Path.cwd().resolve(), "the home folder": resolved("~").resolve()}


def guarded_by(real: Path, guarded: dict[str, Path]) -> str | None:
    """How the resolved folder `real` is one of `guarded` or a parent of one ("a parent of the home
    folder (/home/me)"), or None when it is neither."""
    for what, folder in guarded.items():
        if real == folder or real in folder.parents:
            return f"{'' if real == folder else 'a parent of '}{what} ({folder})"
    return None
