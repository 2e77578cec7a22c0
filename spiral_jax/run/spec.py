"""What a run is, typed: the `RunSpec` that `setup.run_spec` reads from the config, and its parts
(games, rollout, evaluation, cadence, bootstrap). Every layer above the config reads these values."""
from __future__ import annotations

import dataclasses

import numpy as np

from spiral_jax.distributed import DistributedSetup
from spiral_jax.models import ModelConfig
from spiral_jax.rl.rae import RAEConfig
from spiral_jax.rl.train_step import TrainConfig
from spiral_jax.sampling import Sampler, SamplingParams, bucket_length, cache_slots
from spiral_jax.templates import Template


@dataclasses.dataclass(frozen=True)
class Games:
    """The training mixture: games, their weights, the move cap, invalid-move rewards."""
    env_ids: tuple[str, ...]
    weights: tuple[float, ...]
    max_turns: int
    invalid_rewards: tuple[float, float]

    @property
    def probabilities(self) -> np.ndarray:
        """The chance of each game in a step's draw."""
        weights = np.asarray(self.weights, float)
        return weights / np.sum(weights)


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    """How a step's games are played and its samples chosen (config section `rollout`)."""
    mode: str
    opponent: str
    pool_size: int
    pool_every: int
    pool_self_weight: float
    games_per_batch: int
    samples_per_step: int
    selection: str  # "exact": exactly samples_per_step; "all": every sample of the batch's games
    max_prompt_len: int
    schedule: str
    max_in_flight: int | None  # games at once per host; None: all of a step's games
    sampling: SamplingParams

    @property
    def eval_in_flight(self) -> int:
        """Games an evaluation plays at once per host: max_in_flight, else a training batch's games."""
        return self.max_in_flight or self.games_per_batch


@dataclasses.dataclass(frozen=True)
class MathSpec:
    every: int  # 0: never during training
    files: tuple[str, ...]  # "NAME=items.jsonl"
    samples: int
    limit: int | None
    instruction_first: bool
    sampling: SamplingParams


@dataclasses.dataclass(frozen=True)
class EvalSpec:
    """What a run evaluates, and how (config section `eval`)."""
    env_ids: tuple[str, ...]  # eval.env_ids, else the training games
    opponents: tuple[str, ...]
    games: int  # per (game, opponent) at the periodic evaluations
    final_games: int  # at step 0 and at the end
    invalid_rewards: tuple[float, float]
    kuhn_samples: int  # -1: no exploitability; 0: exact scoring; k: k samples per information set
    kuhn_env_id: str  # the one-round Kuhn game whose prompts the exploitability is read with
    sampling: SamplingParams
    math: MathSpec


@dataclasses.dataclass(frozen=True)
class Cadence:
    """How long a run trains and how often it evaluates and saves (config section `train`)."""
    steps: int
    eval_every: int
    checkpoint_every: int
    keep: int
    async_checkpointing: bool
    transcripts: int
    max_skipped_in_a_row: int

    def due(self, every: int, step: int) -> bool:
        """Whether a periodic action of period `every` (0: never) falls on `step`."""
        return bool(every) and step % every == 0


@dataclasses.dataclass(frozen=True)
class BootstrapSpec:
    """Imitation before RL (config section `bootstrap`); `train` is its optimiser."""
    teacher: str
    steps: int
    batch_size: int
    explore: float
    hash_uniform: float
    targets: str
    train: TrainConfig


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A whole run, typed: everything the layers above the config read."""
    seed: int
    out_dir: str
    model: ModelConfig  # with LoRA's adapters when model.lora.rank > 0
    model_source: str  # where the architecture came from: model.path's config.json, or model.random
    model_path: str  # "" for a random init of model.random
    random_shape: dict  # model.random, which with the seed identifies a random init
    lora_merged: bool  # the sampler reads the adapters merged into a copy (else applied in its forward)
    tokenizer_path: str
    template: Template
    mesh: dict  # data / fsdp / tensor
    distributed: DistributedSetup
    games: Games
    rollout: RolloutSpec
    evaluation: EvalSpec
    train: TrainConfig
    cadence: Cadence
    bootstrap: BootstrapSpec | None  # None: no imitation before RL
    rae: RAEConfig
    api: dict
    wandb: dict
    config: dict  # the resolved config (TensorBoard, Weights & Biases)
    config_json: str  # the same, as written to out_dir/config.json and into checkpoints
    config_file: str = ""
    compile_ahead: int = -1  # background threads compiling the next programs; -1: auto

    @property
    def cache_len(self) -> int:
        """KV cache slots the run's sampler needs: the longest prompt plus the most new tokens of
        training games, evaluation games and (when configured) math benchmarks."""
        return self.cache_slots()

    def cache_slots(self, math: bool = False) -> int:
        """`cache_len`; with `math`, math benchmarks counted also where the config names none (`spiral-jax
        eval --suite bench` with --bench files)."""
        m = self.evaluation.math
        new = max(self.rollout.sampling.max_new_tokens, self.evaluation.sampling.max_new_tokens,
                  m.sampling.max_new_tokens if math or m.every or m.files else 0)
        return cache_slots(bucket_length(self.rollout.max_prompt_len), new)

    def sampler(self, cfg: ModelConfig, mesh, math: bool = False) -> Sampler:
        """A sampler sized for this run's prompts and every kind of answer it samples (`math`: see cache_slots)."""
        return Sampler(cfg, mesh, max_prompt_len=self.rollout.max_prompt_len, max_cache_len=self.cache_slots(math),
                       compile_ahead=None if self.compile_ahead < 0 else self.compile_ahead)
