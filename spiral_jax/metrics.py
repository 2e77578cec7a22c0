"""TensorBoard event files without TensorFlow, written by process 0 only.

Uses tensorboard's record format and protos: scalars for numbers, text for game transcripts. Events
are written on the calling thread, so that a full disk is one OSError where a value is logged (the
command says it in one line), not a background thread's traceback. The writer only writes local
files: for a remote log folder (gs://) the events go to a local folder first and each flush uploads
them (`spiral_jax.paths`).
Optionally the same scalars and texts also go to Weights & Biases (`wandb.enabled`, the `wandb` extra).
"""
from __future__ import annotations

import importlib
import io
import itertools
import os
import shutil
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping

import jax
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.summary.writer.record_writer import RecordWriter

from spiral_jax.paths import is_remote, replace_bytes, run_path

# The x axis of every value mirrored to W&B. W&B's own step may only grow (it drops values logged at an
# earlier one), while a run's steps start again: the bootstrap counts its own, then RL counts from 0.
WANDB_STEP = "step"


def check_wandb(wandb: Mapping | None) -> None:
    """Raise where the W&B mirror is on (the config's `wandb` section) but its package is missing; a run
    checks this before it loads any weights."""
    if wandb and wandb.get("enabled"):
        try:
            importlib.import_module("wandb")
        except ImportError:
            raise ValueError("wandb.enabled needs the wandb package: pip install spiral-jax[wandb], or turn the "
                             "mirror off with --config.wandb.enabled=false") from None


_FILE_IDS = itertools.count()


class _EventFile:
    """One TensorBoard event file, named as TensorBoard names them, opened with its version record."""

    def __init__(self, folder: str):
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILE_IDS)}"
        self._records = RecordWriter(open(os.path.join(folder, name), "wb"))
        self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def add_event(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def flush(self) -> None:
        self._records.flush()

    def close(self) -> None:
        self._records.close()


class MetricsWriter:
    """Scalars and text to `logdir`; a no-op on every process but 0 (or when logdir is None)."""

    def __init__(self, logdir: str | Path | None, wandb: Mapping | None = None, config: Mapping | None = None):
        """wandb: {"enabled", "project", "entity", "name"} (the config's `wandb` section): mirror every
        scalar and text to a Weights & Biases run, with `config` as its config."""
        self._writer, self._wandb, self._remote, self._local = None, None, None, None
        if logdir is not None and jax.process_index() == 0:
            if is_remote(logdir):  # written here, uploaded at each flush
                self._remote, self._local = run_path(logdir), tempfile.mkdtemp(prefix="spiral_jax_tb_")
                self._remote.mkdir(parents=True, exist_ok=True)
            else:
                Path(logdir).mkdir(parents=True, exist_ok=True)
            self._writer = _EventFile(self._local or str(logdir))
            if wandb and wandb.get("enabled"):
                check_wandb(wandb)
                import wandb as wandb_module

                try:
                    self._wandb = wandb_module.init(project=wandb.get("project") or None,
                                                    entity=wandb.get("entity") or None,
                                                    name=wandb.get("name") or None, config=dict(config or {}))
                except Exception as e:  # not logged in, no network, a project refused: the mirror is optional
                    raise ConnectionError(
                        f"W&B did not start a run ({type(e).__name__}: {e}); log in with `wandb login`, set "
                        f"WANDB_MODE=offline to sync later, or turn the mirror off with "
                        f"--config.wandb.enabled=false") from e
                self._wandb.define_metric(WANDB_STEP)
                self._wandb.define_metric("*", step_metric=WANDB_STEP)

    def _add(self, step: int, value: summary_pb2.Summary.Value) -> None:
        event = event_pb2.Event(wall_time=time.time(), step=int(step),
                                summary=summary_pb2.Summary(value=[value]))
        self._writer.add_event(event)

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        for tag, v in values.items():
            self._add(step, summary_pb2.Summary.Value(tag=tag, simple_value=float(v)))
        if self._wandb is not None:
            self._wandb.log({**{tag: float(v) for tag, v in values.items()}, WANDB_STEP: int(step)})

    def text(self, step: int, tag: str, text: str) -> None:
        if self._writer is None:
            return
        tensor = TensorProto(dtype="DT_STRING", string_val=[text.encode("utf-8")],
                             tensor_shape=TensorShapeProto(dim=[]))
        meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        self._add(step, summary_pb2.Summary.Value(tag=tag, metadata=meta, tensor=tensor))
        if self._wandb is not None:
            self._wandb.log({tag: text, WANDB_STEP: int(step)})

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._upload()

    def _upload(self) -> None:
        """Copy the local event files to the remote log folder (whole files: they are small)."""
        if self._remote is None:
            return
        for f in Path(self._local).iterdir():
            (self._remote / f.name).write_bytes(f.read_bytes())

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._upload()
            if self._local is not None:
                shutil.rmtree(self._local, ignore_errors=True)
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_scalars(logdir: str | Path, log=print) -> dict[str, list[tuple[int, float]]]:
    """All scalars in a run's event files, file by file in the order they were written: tag ->
    [(step, value)], for tests and plots. A damaged record ends what is read of its file, and a file
    that cannot be read is skipped, each said to `log`; a last record cut off (a run writing it now,
    or stopped mid-write) is left out."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    folder = run_path(logdir)
    for path in _event_files(folder) if folder.is_dir() else []:
        try:
            for record in _records(path.read_bytes()):
                event = event_pb2.Event.FromString(record)
                for v in event.summary.value:
                    if v.WhichOneof("value") == "simple_value":
                        scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
        except (OSError, ValueError, DecodeError) as e:
            log(f"{path} cannot be read whole ({e}); its values from there on are left out")
    return scalars


def _event_files(folder) -> list:
    """The event files in `folder`, oldest first (their names start with the time they were opened)."""
    return sorted(p for p in folder.iterdir() if p.name.startswith("events.out.tfevents."))


def _records(data: bytes) -> Iterator[bytes]:
    """The records of a TFRecord file (length, its CRC, data, its CRC); a last record cut off by a
    crash mid-write is left out. A length or data that fails its CRC is a ValueError: past a bad length,
    where each record starts is unknown, and bad data may still parse, as other values (TensorBoard
    reads no further either)."""
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        if struct.unpack_from("<I", data, at + 8)[0] != masked_crc32c(data[at:at + 8]):
            raise ValueError(f"the record at byte {at} is damaged")
        end = at + 12 + length
        if end + 4 > len(data):
            return
        if struct.unpack_from("<I", data, end)[0] != masked_crc32c(data[at + 12:end]):
            raise ValueError(f"the data of the record at byte {at} is damaged")
        yield data[at + 12:end]
        at = end + 4


def prune_events(logdir, stale: Callable[[str, int], bool], log=print) -> int:
    """Remove from the event files in `logdir` every summary value for which `stale(tag, step)`: what
    a stopped process logged past the checkpoint a resumed run goes on from, which the resumed run
    logs again (TensorBoard would draw both). Files with nothing stale are left as they were; the
    others are rewritten whole. A file that cannot be read whole (damaged, or not an event file) is
    left as it is, said to `log`: rewriting it would lose what follows the damage. Returns how many
    values were removed."""
    folder, removed = run_path(logdir), 0
    if not folder.is_dir():
        return 0
    for path in _event_files(folder):
        kept, dropped = io.BytesIO(), 0
        writer = RecordWriter(kept)
        try:
            data = path.read_bytes()
            for record in _records(data):
                event = event_pb2.Event.FromString(record)
                values = [v for v in event.summary.value if not stale(v.tag, event.step)]
                if len(values) < len(event.summary.value):
                    dropped += len(event.summary.value) - len(values)
                    if not values:
                        continue
                    del event.summary.value[:]
                    event.summary.value.extend(values)
                    record = event.SerializeToString()
                writer.write(record)
        except (OSError, ValueError, DecodeError) as e:
            log(f"{path} is left as it is: it cannot be read ({e}); TensorBoard may show values of the "
                f"stopped run next to the resumed run's")
            continue
        if dropped or len(kept.getvalue()) != len(data):  # stale values, or a record cut off at the end
            replace_bytes(path, kept.getvalue())
        removed += dropped
    return removed
