"""What `spiral-jax` prints for an error that ends a command: one line naming the problem and the fix,
or nothing (None), so that an unexpected error keeps its traceback."""
from __future__ import annotations

import errno

from spiral_jax.models.config import CheckpointError
from spiral_jax.sharding import MeshError

# The errors a command ends with as one line (those `explain` knows; the rest are raised again).
EXPLAINED = (FloatingPointError, CheckpointError, MeshError, ValueError, OSError, RuntimeError)

# What a Ctrl-C outside train's loop leaves behind, said after "interrupted".
_INTERRUPTED = {
    "train": " before the first step (a running loop saves a checkpoint and exits 75); run the command again",
    "eval": ("; the report was not written (transcripts of the matchups that finished may be in its folder); "
             "run the command again"),
    "export": "; --out holds a partial export: run the command again with --overwrite to replace it",
}

_BACKEND_FAILED = "Unable to initialize backend"  # the start of JAX's error when a platform fails to start


def interrupted(command: str) -> str:
    return "interrupted" + _INTERRUPTED.get(command, "")


def explain(command: str, e: BaseException) -> str | None:
    """The line for `e`, one of EXPLAINED, or None when it should keep its traceback."""
    if isinstance(e, FloatingPointError):  # a diverged training (run.TrainingDiverged), NaN logits
        return str(e)
    if isinstance(e, RuntimeError):
        from spiral_jax.aot import CompileError  # `plan --compile`: no compiler for the slice, or a refusal

        if isinstance(e, CompileError):
            return str(e)
        return _backend_failure(str(e)) if str(e).startswith(_BACKEND_FAILED) else None
    from spiral_jax.checkpoint import DiskFullError, is_disk_full

    if isinstance(e, DiskFullError):
        return e.strerror
    if is_disk_full(e):  # metrics, transcripts, an export
        alt, how = {"train": ("move out_dir", " with --resume"),
                    "export": ("choose an --out", " (into the same --out with --overwrite, which clears what "
                                                  "this export wrote)")}.get(command, ("move out_dir", ""))
        return f"the disk is full ({e}); free space or {alt} on a bigger disk, then run again{how}"
    if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        return (f"cannot write {e.filename or 'a file'}: {e.strerror}; choose a folder you can write "
                f"(train: --config.out_dir=NEW_FOLDER)")
    if isinstance(e, OSError) and not isinstance(e, (FileNotFoundError, ConnectionError, PermissionError)):
        return None  # an unexpected system error keeps its traceback; a missing file or dead endpoint is said
    return f"{type(e).__name__}: {e}"


def _backend_failure(message: str) -> str:
    """JAX's error for an accelerator that did not start, with what to do about it: most often another
    process holds the chips (a run still going, a notebook's kernel)."""
    message = message.split(" (set JAX_PLATFORMS")[0].split(" (you may need")[0].rstrip(".")
    if "'tpu'" in message:
        hint = ("on a TPU VM another process may hold the chips (a run still going, a notebook): stop it, or "
                "find it with `sudo lsof -w /dev/accel* /dev/vfio/*`")
    elif "'cuda'" in message or "'gpu'" in message:
        hint = "check `nvidia-smi`, and that JAX's CUDA plugin suits the driver (pip install -e '.[cuda]')"
    else:
        hint = "check that the accelerator is attached and free"
    return f"{message}; {hint}; or set JAX_PLATFORMS=cpu to run on the CPU"
