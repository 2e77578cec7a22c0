"""Training checkpoints with orbax: train state, opponent pool, and a JSON record of the rest.

One checkpoint per saved step holds `state` (parameters, optimiser state, counters), `pool` (frozen
parameter snapshots, when the opponent pool is used) and `meta` (RAE baselines, the step, the RNG seed,
the pool's steps and the config). Saves are asynchronous; the manager keeps the newest `keep`.
Restoring builds every array directly in the sharding of the running job's state.

A save that finds its disk full raises `DiskFullError` saying where and what to do. Orbax writes each
step to a temporary directory and renames it when complete, so the checkpoints already there stay
whole; the resumed run replaces the leftover temporary directory when it saves that step again.
"""
from __future__ import annotations

import contextlib
import errno
import gc
import logging
import re
import shutil
import sys
import types
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from spiral_jax.checkpoint_layout import (TREE_MISMATCHES, LayoutError, check_layout, layers_unlike, param_shapes,
                                          saved_layers_stacked, unlike)
from spiral_jax.models.config import CheckpointError
from spiral_jax.models.params import PARAM_LAYOUT
from spiral_jax.paths import is_remote, run_path


class DiskFullError(OSError):
    """A checkpoint could not be written because the disk holding it is full."""


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` says a disk is full: an OSError's errno, or the text of a tensorstore error
    (orbax reports those as ValueError: RESOURCE_EXHAUSTED ... No space left on device)."""
    if getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(text in str(error) for text in ("No space left on device", "Disk quota exceeded"))


def _reason(error: BaseException) -> str:
    """An error as one short line: tensorstore's messages end in a dump of the array's spec, cut off."""
    text = re.split(r"\.? See full TensorStore details", str(error), maxsplit=1)[0]
    return " ".join(text.split())[:240] or type(error).__name__


def _drop_closed_loop_noise() -> None:
    """Silence what a failed orbax restore leaves behind, which Python would print as tracebacks
    (dozens per damaged checkpoint, making a handled fallback look like a crash):

    * tensorstore reads still in flight complete on their own threads and hand their results to the
      asyncio event loop orbax has closed: RuntimeError("Event loop is closed"), raised where
      nothing can catch it;
    * orbax's read coroutines that never finished are closed when garbage-collected, and turn the
      GeneratorExit into an exception of their own ("Exception ignored in: <coroutine ...>");
    * orbax's read tasks that failed after the first failure was raised are garbage-collected with
      their errors unread, which asyncio logs ("Task exception was never retrieved").

    The first two reach sys.unraisablehook; those are dropped, and anything else goes to the previous
    hook. The third is dropped from asyncio's log where the task is one of orbax's."""
    previous = sys.unraisablehook
    if getattr(previous, "drops_closed_loop_noise", False):
        return
    logging.getLogger("asyncio").addFilter(
        lambda record: not (str(record.msg).startswith("Task exception was never retrieved")
                            and "orbax" in str(record.msg)))

    def hook(unraisable):
        error, source = unraisable.exc_value, unraisable.object
        if isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
            return
        if (isinstance(source, types.CoroutineType) and isinstance(error.__cause__, GeneratorExit)
                and "orbax" in source.cr_code.co_filename):
            return
        previous(unraisable)

    hook.drops_closed_loop_noise = True
    sys.unraisablehook = hook


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


# The suffix of a step's folder while a new save of that step (step 0: the bootstrap's part-way
# state, saved again) is being written; it is deleted once the new one is complete.
_REPLACED = ".replaced"


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3, async_save: bool = True, writer: bool = False):
        """writer: the run's own checkpointer, under out_dir's lock, which repairs what a save killed
        part-way left; readers (eval, export, serve) touch nothing, as the run may be saving."""
        # Cloud storage (gs://...) as it is: multi-host jobs need a directory every host can reach. A URI
        # of a scheme with no file system (gcs://, https://) is refused by run_path, in one line.
        self.directory = str(run_path(directory)) if is_remote(directory) else Path(directory).absolute()
        if writer:
            self._recover_replaced()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._async = async_save
        self._pending: int | None = None  # the step an async save may still be writing
        self._replaced: int | None = None  # the step whose previous version waits for its new save

    def _recover_replaced(self) -> None:
        """What a process that died while saving a step again left: the step's previous version is
        the step again when the new one never completed (orbax names a step's folder only once it
        is), and is deleted when it did."""
        if not isinstance(self.directory, Path) or jax.process_index() != 0 or not self.directory.is_dir():
            return
        for old in self.directory.glob(f"*{_REPLACED}"):
            new = self.directory / old.name[:-len(_REPLACED)]
            if new.is_dir():
                shutil.rmtree(old)
            else:
                old.rename(new)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def saving(self) -> bool:
        """Whether an asynchronous save is still being written."""
        return self._manager.is_saving_in_progress()

    def save(self, step: int, state, pool: list, meta: dict, reference=None) -> None:
        """Write `step` in the background. `reference`: the frozen policy of a KL penalty, if any."""
        meta = {**meta, "param_layout": PARAM_LAYOUT, "reference": reference is not None,
                "param_shapes": param_shapes(state)}
        items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        if pool:
            items["pool"] = ocp.args.PyTreeSave(list(pool))
        if reference is not None:
            items["reference"] = ocp.args.StandardSave(reference)
        # An async save fails in the background; its error comes up at the next call.
        with self._background_failure_reported(self._pending):
            self._manager.check_for_errors()
        if self._replaced is not None:
            self.wait()
        if step in self._manager.all_steps():  # step 0 again: the bootstrap's part-way state, now whole
            self.wait()
            self._set_for_replacement(step)
        with self._full_disk_reported(step if self._pending is None else f"{self._pending} or {step}"):
            self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        self._pending = step if self._async else None
        if not self._async:
            self._drop_replaced()

    def _set_for_replacement(self, step: int) -> None:
        """Move a saved step out of the way of its new save, kept as `<step>.replaced` until that save
        is complete, so that a crash while writing it never leaves the run without the step. (On
        cloud storage, where a rename is a copy, the step is deleted.)"""
        if not isinstance(self.directory, Path):
            self._manager.delete(step)
            return
        if jax.process_index() == 0:
            old = self.directory / f"{step}{_REPLACED}"
            if old.exists():
                shutil.rmtree(old)
            (self.directory / str(step)).rename(old)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices(f"spiral_jax.checkpoint.replace.{step}")
        self._manager.reload()
        self._replaced = step

    def _drop_replaced(self) -> None:
        """Once the new save of a replaced step is complete, its previous version goes."""
        if self._replaced is not None and jax.process_index() == 0:
            shutil.rmtree(self.directory / f"{self._replaced}{_REPLACED}", ignore_errors=True)
        self._replaced = None

    @contextlib.contextmanager
    def _full_disk_reported(self, step: int | str | None):
        try:
            yield
        except Exception as e:
            if not is_disk_full(e):
                raise
            raise DiskFullError(errno.ENOSPC, self._disk_full_message(step)) from e

    @contextlib.contextmanager
    def _background_failure_reported(self, step: int | None):
        """An async save's failure, whatever it was, said as what it means for the run: which step
        is lost and which complete one a resumed run starts from."""
        try:
            with self._full_disk_reported(step):
                yield
        except DiskFullError:
            raise
        except Exception as e:
            self._pending = None
            complete = [s for s in self._manager.all_steps() if s != step]
            newest = f"the newest complete checkpoint is step {max(complete)}" if complete else \
                "no checkpoint is complete yet"
            reason = " ".join(str(e).split())[:300] or type(e).__name__
            raise CheckpointError(f"the checkpoint of step {step} could not be written in the background "
                                  f"({reason}); {newest}: fix the cause, then run again with --resume") from e

    def _disk_full_message(self, step: int | str | None) -> str:
        what = "a checkpoint" if step is None else f"the checkpoint of step {step}"
        where, free, complete = str(self.directory), "", []
        if isinstance(self.directory, Path):
            free = f", {shutil.disk_usage(self.directory).free / 2**20:.1f} MiB free"
            complete = sorted(int(d.name) for d in self.directory.iterdir() if d.name.isdigit())
        newest = f"the newest complete checkpoint, step {complete[-1]}" if complete else \
            "no complete checkpoint yet: the run starts over"
        return (f"{what} could not be written: the disk holding {where} is full{free}. Free space there or "
                f"lower train.keep (checkpoints kept) or move out_dir to a bigger disk, then run again with "
                f"--resume ({newest})")

    def restore(self, step: int | None, like_state, like_params, log=print,
                pool_keep: int | None = None) -> tuple[object, list, dict]:
        """(state, pool, meta) of `step`, shaped and sharded like the arguments. Without a step, the
        newest checkpoint that restores: an unreadable one (a truncated file, a half-copied folder) is
        reported, renamed to `<step>.unreadable` so the resumed run can write that step again, and
        the next older one is tried. With `pool_keep`, only the newest that many pool snapshots are
        read (the older ones never take memory) and meta["pool_steps"] lists just those."""
        def read(s):
            return self._restore(s, like_state, like_params, pool_keep)

        if step is not None:
            return self._read_step(step, read)
        return self._newest_readable(read, log, set_aside=True)

    def restore_reference(self, step: int, like_params):
        """The KL reference saved with `step` (its meta says "reference": true), shaped and sharded
        like `like_params`."""
        item = ocp.args.StandardRestore(_abstract(like_params))
        return self._manager.restore(step, args=ocp.args.Composite(reference=item))["reference"]

    def restore_params(self, like_params, log=print, step: int | None = None) -> tuple[dict, int, dict]:
        """(trained parameters, step, meta) of checkpoint `step` (default: the newest readable one),
        and nothing else: no optimiser state is read or allocated, so evaluation and export need one
        copy of the weights. The arrays are built in the shardings of `like_params`
        (ShapeDtypeStructs), e.g. the sampler's."""
        def params_of(step):
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            check_layout(self.directory, step, meta, {"params": like_params})
            item = ocp.args.PyTreeRestore(item={"params": like_params}, partial_restore=True,
                                          restore_args=jax.tree.map(
                                              lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype),
                                              {"params": like_params}))
            params = self._restore_items(step, dict(state=item))["state"]["params"]
            # A partial restore hands back what the checkpoint lacks as it was asked for (abstract).
            if absent := [jax.tree_util.keystr(path) for path, x in jax.tree_util.tree_leaves_with_path(params)
                          if isinstance(x, jax.ShapeDtypeStruct)]:
                raise unlike(self.directory, step, f"lacks {len(absent)} parameter(s) this run's config makes (first "
                                         f"{absent[0]})")
            return params, step, meta

        if step is not None:
            saved = sorted(self._manager.all_steps())
            if step not in saved:
                raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}; it holds steps "
                                        f"{', '.join(map(str, saved)) or 'none'}")
            return self._read_step(step, params_of)
        return self._newest_readable(params_of, log, set_aside=False)

    def _read_step(self, step: int, restore):
        """`restore(step)` of a step asked for by number: a damaged one is a one-line CheckpointError
        (it is not set aside: the caller chose it, and may be reading a run that is still training)."""
        _drop_closed_loop_noise()
        try:
            return restore(step)
        except (LayoutError, CheckpointError):
            raise
        except Exception as e:  # orbax and tensorstore raise many types for damaged files
            if is_disk_full(e):
                raise
            others = [s for s in sorted(self._manager.all_steps()) if s != step]
            raise CheckpointError(f"checkpoint step {step} in {self.directory} cannot be read ({_reason(e)}); "
                                  f"choose another step (it holds {', '.join(map(str, others)) or 'no other'}), "
                                  f"or leave the step out for the newest one that reads") from None

    def _newest_readable(self, restore, log, set_aside: bool):
        """Each unreadable step is one line (the step, the reason, where it was moved); no traceback.
        `set_aside`: rename unreadable steps out of the way, for a run that resumes and will write
        them again; eval, export and serve only read, maybe while the run still trains, and leave
        them as they are."""
        steps = sorted(self._manager.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.directory}")
        _drop_closed_loop_noise()
        failures = []
        for step in steps:
            try:
                restored = restore(step)
            except LayoutError:
                raise
            except Exception as e:  # orbax and tensorstore raise many types for damaged files
                if is_disk_full(e):
                    raise
                reason = _reason(e)
                failures.append(f"step {step}: {reason}")
                older = [s for s in steps if s < step]
                aside = f"{self._set_aside(step)}; " if set_aside else ""
                log(f"checkpoint step {step} in {self.directory} cannot be read ({reason}); {aside}"
                    + (f"trying step {older[0]}" if older else "no older one to try"))
                gc.collect()  # the failed read's coroutines end now, under the filter, not mid-run
                continue
            if failures:
                log(f"resuming from step {step}, the newest checkpoint that restores")
            return restored
        raise CheckpointError(f"no checkpoint in {self.directory} can be read: " + "; ".join(failures)
                              + ". Start a new out_dir, or copy intact checkpoints back")

    def _set_aside(self, step: int) -> str:
        """Rename an unreadable step folder out of orbax's way (kept for inspection, not deleted), to
        `<step>.unreadable`, or `<step>.unreadable-2`, ... when the step was set aside before; says
        what was done. In a bucket, where a rename is a copy, the step stays: a save of it replaces it."""
        if not isinstance(self.directory, Path):
            return "left where it is (a bucket has no rename; a later save of that step replaces it)"
        name = f"{step}.unreadable"
        if jax.process_index() == 0:
            src = self.directory / str(step)
            n = 1
            while (self.directory / name).exists():
                n += 1
                name = f"{step}.unreadable-{n}"
            if src.is_dir():
                src.rename(self.directory / name)
        self._manager.reload()
        return f"set aside as {name}"

    def _restore(self, step: int, like_state, like_params, pool_keep: int | None) -> tuple[object, list, dict]:
        meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        check_layout(self.directory, step, meta, like_state)
        items = dict(state=ocp.args.StandardRestore(_abstract(like_state)))
        saved = len(meta.get("pool_steps") or [])
        keep = saved if pool_keep is None else min(pool_keep, saved)
        if keep:  # the older snapshots are placeholders, which orbax skips (PyTreeRestore, as saved)
            snapshot = _abstract(like_params)
            like = [jax.tree.map(lambda _: ocp.PLACEHOLDER, snapshot)] * (saved - keep) + [snapshot] * keep
            items["pool"] = ocp.args.PyTreeRestore(item=like, restore_args=jax.tree.map(
                lambda x: x if x is ocp.PLACEHOLDER else ocp.ArrayRestoreArgs(sharding=x.sharding, dtype=x.dtype),
                like))
        restored = self._restore_items(step, items)
        meta["pool_steps"] = list(meta.get("pool_steps") or [])[saved - keep:]
        return restored["state"], list(restored.get("pool") or [])[saved - keep:], meta

    def _restore_items(self, step: int, items: dict) -> dict:
        """The checkpoint's `items`. A parameter tree shaped unlike the saved one is a config that
        differs from the one that wrote it, not a damaged file: a LayoutError saying which setting
        to change, and the checkpoint left where it is."""
        try:
            return self._manager.restore(step, args=ocp.args.Composite(**items))
        except ValueError as e:
            if not any(text in str(e) for text in TREE_MISMATCHES):
                raise
            saved = saved_layers_stacked(str(e))
            if saved is not None:
                raise layers_unlike(self.directory, step, saved) from None
            raise unlike(self.directory, step, f"holds a parameter tree unlike the one this run's config makes "
                                     f"({_reason(e)})") from None

    def wait(self) -> None:
        with self._background_failure_reported(self._pending):
            self._manager.wait_until_finished()
            self._manager.check_for_errors()
        self._pending = None
        self._drop_replaced()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()
