"""Where a run writes: one path type for local folders and remote ones (gs://) alike.

Every file a run writes (summary, config, transcripts, evaluation reports, TensorBoard events) goes
through `run_path`, an etils.epath.Path: pathlib's interface over the local file system, or over
fsspec for a URI (gcsfs for gs://, the `gcs` extra). Checkpoints already go through the same layer
(orbax). TensorBoard's event writer only writes local files, so for a remote log folder
`MetricsWriter` writes a local copy and uploads it at each flush.
"""
from __future__ import annotations

import os

from etils import epath


def run_path(path: str | os.PathLike) -> epath.Path:
    """The path a run reads and writes `path` through (a local folder or a URI such as gs://b/run)."""
    return epath.Path(path)


def replace_text(path: epath.Path, text: str) -> None:
    """Write `path` whole: a temporary file next to it, then moved into place, so that a crash leaves
    the old contents, never half of the new ones."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{path.name}.tmp"
    tmp.write_text(text)
    tmp.replace(path)


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` is a URI (gs://...) rather than a local path."""
    return "://" in os.fspath(path)
