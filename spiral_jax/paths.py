"""Where a run writes: one path type for local folders and remote ones (gs://) alike.

Every file a run writes (summary, config, transcripts, evaluation reports, TensorBoard events) goes
through `run_path`, an etils.epath.Path: pathlib's interface over the local file system, or over
fsspec for a URI (gcsfs for gs://, the `gcs` extra). Checkpoints already go through the same layer
(orbax). TensorBoard's event writer only writes local files, so for a remote log folder
`MetricsWriter` writes a local copy and uploads it at each flush.

File names made from what a user wrote (an opponent spec such as `openai:m@http://host/v1`, a
benchmark name) go through `file_in`, for the trainer's evaluations and `spiral-jax eval` alike: the
name cannot hold a path, and the file is checked to lie inside the folder it is meant for.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
from pathlib import Path

from etils import epath


def run_path(path: str | os.PathLike) -> epath.Path:
    """The path a run reads and writes `path` through (a local folder or a URI such as gs://b/run). A URI
    of a scheme epath has no file system for (https://, gcsfs's alias gcs://) is a ValueError."""
    try:
        return epath.Path(path)
    except KeyError:  # epath's registry of URI schemes
        scheme = os.fspath(path).split("://", 1)[0]
        raise ValueError(f"{os.fspath(path)}: a {scheme}:// URI is not a place spiral-jax reads or writes files; "
                         f"give a local path or a Cloud Storage one, gs://BUCKET/PATH") from None


def replace_text(path: epath.Path, text: str) -> None:
    """Write `path` whole: a temporary file next to it, then moved into place, so that a crash leaves
    the old contents, never half of the new ones."""
    replace_bytes(path, text.encode())


def replace_bytes(path: epath.Path, data: bytes) -> None:
    """`replace_text` for bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir():  # the move would fail after the write, with a message that names no path
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    tmp = path.parent / f"{path.name}.tmp"
    tmp.write_bytes(data)
    tmp.replace(path)


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` is a URI (gs://...) rather than a local path."""
    return "://" in os.fspath(path)


def local_folder(path: str | os.PathLike, what: str) -> Path:
    """`path`, a folder of model weights or a tokenizer, as a local path: those load from local files
    (safetensors, transformers), so a URI (gs://...) is a ValueError naming `what` and the copy to make."""
    if is_remote(path):
        raise ValueError(f"{what}: {os.fspath(path)} is a URI, and weights and tokenizers load from a local folder; "
                         f"copy it to one (gcloud storage rsync -r {os.fspath(path)} /ckpt/NAME) and give that folder")
    return Path(path)


_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]")


def safe_name(text: str) -> str:
    """A file name for free text: characters other than letters, digits and `. _ + = @ -` become "_"
    (so no "/" and no path), a leading dot too (no "..", no hidden file). A name that had to change,
    or is too long, ends in a short hash of the text, so two texts never share a file."""
    name = _UNSAFE.sub("_", text)
    name = "_" + name[1:] if name.startswith(".") else name
    if name != text or len(name) > 120 or not name:
        name = f"{name[:100]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return name


def file_in(folder: str | os.PathLike, name: str, suffix: str = "") -> epath.Path:
    """`folder`/`safe_name(name)``suffix`, checked to lie inside `folder`."""
    path = run_path(folder) / (safe_name(name) + suffix)
    inner, outer = os.path.normpath(os.fspath(path)), os.path.normpath(os.fspath(folder))
    if os.path.dirname(inner) != outer:
        raise ValueError(f"{name!r} would be written to {path}, outside {folder}")
    return path


def transcript_path(folder: str | os.PathLike, env_id: str, opponent: str) -> epath.Path:
    """Where the games of `env_id` against `opponent` are written in `folder`."""
    return file_in(folder, f"{env_id}_vs_{opponent}", ".jsonl")
