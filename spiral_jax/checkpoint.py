"""Training checkpoints with orbax: train state, opponent pool, and a JSON record of the rest.

One checkpoint per saved step holds `state` (parameters, optimiser state, counters), `pool` (frozen
parameter snapshots, when the opponent pool is used) and `meta` (RAE baselines, the step, the RNG seed,
the pool's steps and the config). Saves are asynchronous; the manager keeps the newest `keep`.
Restoring builds every array directly in the sharding of the running job's state.
"""
from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp

from spiral_jax.models.params import PARAM_LAYOUT


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 3, async_save: bool = True):
        # Cloud storage (gs://...) as it is: multi-host jobs need a directory every host can reach.
        self.directory = str(directory) if "://" in str(directory) else Path(directory).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state, pool: list, meta: dict) -> None:
        meta = {**meta, "param_layout": PARAM_LAYOUT}
        items = dict(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        if pool:
            items["pool"] = ocp.args.StandardSave(list(pool))
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)

    def restore(self, step: int | None, like_state, like_params) -> tuple[object, list, dict]:
        """(state, pool, meta) of `step` (default: the latest), shaped and sharded like the arguments."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint to resume from in {self.directory}")
        meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if meta.get("param_layout") != PARAM_LAYOUT:
            raise ValueError(
                f"checkpoint step {step} in {self.directory} stores weights in an older layout ([in, out]; "
                f"this version stores them [out, in] like Hugging Face). It cannot be resumed by this "
                f"version: resume it with the spiral_jax version that wrote it, or start a new out_dir")
        items = dict(state=ocp.args.StandardRestore(_abstract(like_state)))
        if meta.get("pool_steps"):
            items["pool"] = ocp.args.StandardRestore([_abstract(like_params)] * len(meta["pool_steps"]))
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        return restored["state"], list(restored.get("pool") or []), meta

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
