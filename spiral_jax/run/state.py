"""A run's state as one value: what a checkpoint holds and a resumed run continues from.

The arrays (the train state, the pool's snapshots, the KL penalty's reference) and the record beside
them (step, phase, RAE baselines, the pool's steps, running totals, bootstrap progress, the LoRA
base's fingerprint) travel together: `save` writes one checkpoint of the whole value, `restore` reads
one back in the shardings of a template. During the imitation bootstrap the phase is "bootstrap" and
`train` is the bootstrap's optimiser state, `bootstrap_step` imitation steps in; from RL's step 0 on,
the phase is "rl".
"""
from __future__ import annotations

import dataclasses

from spiral_jax.checkpoint import Checkpointer
from spiral_jax.rl.rae import init_rae_state
from spiral_jax.rl.train_step import TrainState

PHASES = ("bootstrap", "rl")


def _no_totals() -> dict:
    return {"games": 0, "sampled_tokens": 0, "trained_tokens": 0}


@dataclasses.dataclass
class RunState:
    train: TrainState
    step: int = 0  # RL updates done
    phase: str = "rl"
    bootstrap_step: int = 0  # imitation steps done (phase "bootstrap")
    rae: dict = dataclasses.field(default_factory=init_rae_state)
    pool: list = dataclasses.field(default_factory=list)  # snapshots of the policy, sampler layout
    pool_steps: list[int] = dataclasses.field(default_factory=list)  # the step of each snapshot
    reference: object = None  # the KL penalty's frozen policy (train layout), with optim.kl_coef
    totals: dict = dataclasses.field(default_factory=_no_totals)  # since step 0, resumes included
    lora_base: str | None = None  # the fingerprint of the weights LoRA adapters are trained on
    lora_base_files: list | None = None  # the files of model.path it was taken of (`build.base_files`)
    config: str = ""  # the config (JSON) of the run that wrote the restored checkpoint; "" when new
    wall_time_s: float = 0.0  # the run's wall time up to this state's checkpoint, resumes included

    def __post_init__(self):
        if self.phase not in PHASES:
            raise ValueError(f"run phase {self.phase!r}; one of {', '.join(PHASES)}")

    def record(self, seed: int, config_json: str) -> dict:
        """The checkpoint's JSON record: everything but the arrays."""
        return dict(step=self.step, seed=seed, rae=self.rae, pool_steps=self.pool_steps, config=config_json,
                    totals=self.totals, phase=self.phase, bootstrap_step=self.bootstrap_step,
                    lora_base=self.lora_base, lora_base_files=self.lora_base_files, wall_time_s=self.wall_time_s)

    def logged_after(self, tag: str, step: int) -> bool:
        """Whether a metric logged at `step` comes from past this state: a process stopped after its
        checkpoint logged it, and a run resumed from here logs that step again. The bootstrap's
        curves (bootstrap/...) count its own steps, the others RL steps."""
        if tag.startswith("bootstrap/"):
            return self.phase == "bootstrap" and step >= self.bootstrap_step
        return step > self.step

    def save(self, ckpt: Checkpointer, seed: int, config_json: str) -> None:
        """One checkpoint of this state, numbered by its RL step (0 throughout the bootstrap)."""
        reference = self.reference if self.phase == "rl" else None
        ckpt.save(self.step, self.train, self.pool, self.record(seed, config_json), reference)

    @classmethod
    def restore(cls, ckpt: Checkpointer, like: "RunState", like_policy, log=print,
                reference: bool = True, pool_keep: int | None = None) -> "RunState":
        """The newest readable checkpoint, shaped and sharded like `like` (its pool's snapshots like
        `like_policy`, the newest `pool_keep` of them). With `reference`, the KL reference comes back
        when the checkpoint holds one."""
        train, pool, meta = ckpt.restore(None, like.train, like_policy, log=log, pool_keep=pool_keep)
        phase = meta.get("phase", "rl")
        reference = ckpt.restore_reference(meta["step"], train.params) \
            if reference and meta.get("reference") and phase == "rl" else None
        return cls(train, meta["step"], phase, meta.get("bootstrap_step", 0), meta["rae"], pool,
                   list(meta["pool_steps"]), reference, meta.get("totals", _no_totals()), meta.get("lora_base"),
                   meta.get("lora_base_files"), meta.get("config", ""), meta.get("wall_time_s", 0.0))
