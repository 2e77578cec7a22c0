"""The one reader of the experiment config: a `ConfigDict` becomes a `RunSpec` (`spec.py`), a typed
value of everything a run is (`spiral_jax.run.build` turns one into the model, tokenizer and policies).

`run_spec(c)` reads every section once, derives what several places need (sampling settings, the
optimiser's TrainConfig, the KV cache size, games in flight) and checks what can be checked without
devices: unknown games, bad mixture weights, opponents a game cannot host. The trainer, the planner,
the ahead-of-time compiler and `spiral-jax eval/export/serve` read the spec, never the config.
`spiral_jax.config` holds the schema itself.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import numpy as np
from ml_collections import ConfigDict

from spiral_jax.config import EMBEDDED_TOKENIZER, base_config, check_values, error_text
from spiral_jax.distributed import DistributedSetup
from spiral_jax.envs import make, registered_ids
from spiral_jax.eval.kuhn_policy import ENV_ID as KUHN_ENV_ID
from spiral_jax.models import CheckpointError, ModelConfig
from spiral_jax.paths import local_folder
from spiral_jax.policies import WEIGHTLESS, PolicySpec, kind
from spiral_jax.rl.bootstrap import check_teacher
from spiral_jax.rl.rae import RAEConfig
from spiral_jax.rl.train_step import TrainConfig
from spiral_jax.run.spec import BootstrapSpec, Cadence, EvalSpec, Games, MathSpec, RolloutSpec, RunSpec
from spiral_jax.sampling import SamplingParams
from spiral_jax.templates import Template


def train_config(optim: ConfigDict, **changes) -> TrainConfig:
    """The optimiser, loss and micro-batching settings (`optim`, with `changes` on top)."""
    fields = {**optim.to_dict(), **changes}
    fields["tis_cap"] = fields["tis_cap"] or None  # 0 = off in config files
    fields["micro_batch_size"] = fields["micro_batch_size"] or None
    fields["samples_per_row"] = fields.get("samples_per_row") or None  # 0 = auto
    return TrainConfig(**fields)


def _bootstrap(c: ConfigDict) -> BootstrapSpec | None:
    """The bootstrap's optimiser is `optim` with its own learning rate and schedule: plain token-mean
    maximum likelihood (one epoch, no KL penalty or importance weights), micro-batched like RL."""
    b = c.bootstrap
    if not b.enabled:
        return None
    check_teacher(b.teacher, b.targets)
    tc = train_config(c.optim, learning_rate=b.learning_rate, normaliser="token_mean", epochs=1,
                      kl_coef=0.0, tis_cap=0.0, warmup_steps=b.warmup_steps, schedule=b.schedule,
                      decay_steps=max(b.steps - b.warmup_steps, 1), final_lr_fraction=0.0)
    return BootstrapSpec(b.teacher, b.steps, b.batch_size, b.explore, b.hash_uniform, b.targets, tc)


def _runtime(c: ConfigDict) -> dict:
    return dict(compute_dtype=c.model.compute_dtype, scan_layers=c.model.scan_layers, remat=c.model.remat,
                remat_saves=tuple(c.model.remat_saves), attention=c.model.attention,
                decode_attention=c.model.decode_attention)


def _with_lora(c: ConfigDict, cfg: ModelConfig) -> ModelConfig:
    lora_ = c.model.lora
    if not lora_.rank:  # LoRA settings given without a rank: a full fine-tune the user did not ask for
        default = base_config().model.lora
        if given := [f"model.lora.{k}={lora_[k]!r}" for k in ("alpha", "targets", "sample")
                     if (set(lora_[k]) != set(default[k]) if k == "targets" else lora_[k] != default[k])]:
            raise ValueError(f"{', '.join(given)} but model.lora.rank=0, which trains no adapters (full fine-tuning); "
                             f"give --config.model.lora.rank=N (e.g. 16) to train LoRA adapters, or leave "
                             f"model.lora at its defaults to fine-tune every weight")
    if lora_.dropout:
        raise ValueError(f"model.lora.dropout={lora_.dropout}: dropout on the adapters is not supported; use 0")
    if lora_.sample not in ("merged", "adapters"):
        raise ValueError(f"model.lora.sample={lora_.sample!r}; use merged or adapters")
    return cfg.replace(lora_rank=lora_.rank, lora_alpha=lora_.alpha, lora_targets=tuple(lora_.targets))


def model_config(c: ConfigDict) -> ModelConfig:
    """The architecture (model.path's config.json, else model.random), with model.lora's adapters."""
    if c.model.path and not local_folder(c.model.path, "model.path").exists():
        raise CheckpointError(f"model.path={c.model.path!r} does not exist; give the Hugging Face checkpoint folder "
                              f"(moved: --config.model.path=WHERE_IT_IS_NOW; a LoRA run's adapters need the very "
                              f"files they were trained on)")
    if c.model.path:
        return _with_lora(c, ModelConfig.from_pretrained(c.model.path, **_runtime(c)))
    return _with_lora(c, ModelConfig(**c.model.random.to_dict(), **_runtime(c)))


def _check_games(c: ConfigDict) -> None:
    """Unknown game ids and unusable mixture weights fail here, before anything is compiled."""
    if len(c.games.weights) != len(c.games.env_ids):
        raise ValueError(f"games.weights has {len(c.games.weights)} entries for {len(c.games.env_ids)} games.env_ids; "
                         f"give one weight per game, in games.env_ids' order, e.g. --config.games.weights="
                         f"'{tuple([1.0] * len(c.games.env_ids))}'")
    for key, env_ids in (("games.env_ids", c.games.env_ids), ("eval.env_ids", c.eval.env_ids)):
        for env_id in env_ids:
            try:
                make(env_id)
            except ValueError as err:  # the key and the nearest id; the registry's message lists them all
                near = difflib.get_close_matches(env_id, registered_ids(), n=1)
                head, sep, rest = error_text(err).partition("; ")
                raise ValueError(f"{key}: {head}{f' (did you mean {near[0]!r}?)' if near else ''}{sep}{rest}") from None
    weights = np.asarray(c.games.weights, float)
    if not (np.all(np.isfinite(weights)) and np.all(weights >= 0) and weights.sum() > 0):
        raise ValueError(f"games.weights={tuple(c.games.weights)}: the mixture weights must be "
                         f"non-negative with a positive sum, one per games.env_ids entry")


def _check_scripted_opponents(c: ConfigDict, eval_env_ids: tuple[str, ...]) -> None:
    """Scripted players need a game that lists its legal moves: TextArena games judge free-text
    moves themselves, so there only model players (the trained one, a frozen one) can play."""
    scripted = [("eval.opponents", env_id, o) for env_id in eval_env_ids for o in c.eval.opponents
                if kind(o) == "scripted"]
    if c.rollout.mode == "fixed_opponent" and kind(c.rollout.opponent) == "scripted":
        scripted += [("rollout.opponent", env_id, c.rollout.opponent) for env_id in c.games.env_ids]
    for key, env_id, opponent in scripted:
        env = make(env_id)
        env.reset(0)
        if not env.legal_actions():
            raise ValueError(f"{key}: the {opponent} player needs a game that lists its legal moves, and "
                             f"{env_id} does not; evaluate it against model players only (e.g. "
                             f"--config.eval.opponents='()' and `spiral-jax eval --opponents self`)")


def _model(c: ConfigDict, planning: bool) -> tuple[ModelConfig, str]:
    """The architecture and where it came from. Planning a preset whose checkpoint is not
    downloaded yet uses the shape in model.random."""
    path = c.model.path
    if path and (not planning or (Path(path) / "config.json").exists()):
        return model_config(c), f"{path}/config.json"
    shape = _with_lora(c, ModelConfig(**c.model.random.to_dict(), **_runtime(c)))
    return shape, f"model.random (no config.json at {path!r})" if path else "model.random"


def _check_together(c: ConfigDict, model: ModelConfig, model_source: str, planning: bool) -> None:
    """Values each fine alone that do not go together, or name what is not there: failures that would
    otherwise come after the model is built, or never (a run past the model's context)."""
    r, e, m, d = c.rollout, c.eval, c.eval.math, c.distributed
    opponent = kind(r.opponent)
    if r.mode == "fixed_opponent" and opponent in ("model", "self", "pool"):
        mode = "pool" if opponent == "pool" else "self_play"
        raise ValueError(f"rollout.opponent={r.opponent!r} is {'a snapshot of ' if mode == 'pool' else ''}the trained "
                         f"model, which rollout.mode={mode!r} plays against; fixed_opponent takes random, scripted, an "
                         f"API model (openai:MODEL@URL) or a model folder: give --config.rollout.mode={mode} or one of those")
    if r.mode == "pool" and c.train.steps and (r.pool_every >= c.train.steps or r.pool_self_weight == 1):
        why = ("rollout.pool_self_weight=1 makes every game self-play" if r.pool_self_weight == 1 else
               f"the first snapshot is taken after rollout.pool_every={r.pool_every} steps, and train.steps="
               f"{c.train.steps} ends before a game is played against one")
        raise ValueError(f"rollout.mode='pool': {why}, so the run would be plain self-play; give a pool_every "
                         f"below train.steps and a pool_self_weight below 1, or --config.rollout.mode=self_play")
    for key, (mover, other) in (("games.invalid_rewards", c.games.invalid_rewards), ("eval.invalid_rewards",
                                                                                    e.invalid_rewards)):
        if mover > other:  # swapped: an invalid move would pay, and be learned
            raise ValueError(f"{key}={(mover, other)} pays the player who moves invalidly more than the other; give "
                             f"(the invalid mover's reward, the other player's), e.g. {(other, mover)}")
    if r.mode == "fixed_opponent" and (opponent not in ("scripted", "api", "checkpoint") or (
            opponent == "checkpoint" and not planning and not local_folder(r.opponent, "rollout.opponent").is_dir())):
        raise FileNotFoundError(f"rollout.opponent={r.opponent!r} is neither 'random', 'scripted', an API model "
                                f"(openai:MODEL@URL) nor a model folder; give a Hugging Face checkpoint folder with "
                                f"the model's architecture (e.g. one written by spiral-jax export)")
    new = max(("rollout", r.max_new_tokens), ("eval", e.max_new_tokens),
              ("eval.math", m.max_new_tokens if m.every or m.files else 0), key=lambda kv: kv[1])
    # Against the checkpoint's own context: a planned shape (model.random, no config.json here yet) has none.
    if c.model.path and model_source.endswith("/config.json") and r.max_prompt_len + new[1] > \
            model.max_position_embeddings:
        raise ValueError(f"rollout.max_prompt_len={r.max_prompt_len} + {new[0]}.max_new_tokens={new[1]} is past the "
                         f"model's context, max_position_embeddings={model.max_position_embeddings} ({model_source}); "
                         f"give at most {model.max_position_embeddings} positions in all")
    if c.optim.schedule != "constant" and c.optim.decay_steps < 1:
        raise ValueError(f"optim.schedule={c.optim.schedule!r} decays over optim.decay_steps; give at least 1 "
                         f"(decay_steps={c.optim.decay_steps}), or optim.schedule='constant'")
    if d.enabled and d.num_processes and d.process_id >= d.num_processes:
        raise ValueError(f"distributed.process_id={d.process_id}: give one below distributed.num_processes="
                         f"{d.num_processes} (0 for the coordinator), or -1 to read JAX_PROCESS_ID")


# Config values that name a local folder, where a leading ~ means the home folder.
_FOLDERS = (("out_dir",), ("model", "path"), ("tokenizer", "path"), ("rollout", "opponent"))


def _home_expanded(c: ConfigDict) -> ConfigDict:
    """`c`, or a copy of it with the leading ~ of its folder values expanded: a shell leaves
    `--config.out_dir=~/runs/x` as written, and a run would make a folder named ~ in the working
    directory, or find no model at `~/ckpt`."""
    tilde = [key for key in _FOLDERS if str(_get(c, key)).startswith("~")]
    if not tilde:
        return c
    c = c.copy_and_resolve_references()
    for *parents, name in tilde:
        section = _get(c, parents)
        section[name] = os.path.expanduser(section[name])
    return c


def _get(c: ConfigDict, key) -> object:
    """The value at a path of keys in `c` (a section for a shorter path)."""
    for name in key:
        c = c[name]
    return c


def run_spec(c: ConfigDict, config_file: str = "", planning: bool = False) -> RunSpec:
    """Read config `c` once into a RunSpec, checking what can be checked without devices.
    `planning`: for the memory planner, which needs the model's shape, not its weights."""
    check_values(c)  # types, ranges and choices of single fields
    c = _home_expanded(c)
    r, e, m, t = c.rollout, c.eval, c.eval.math, c.train
    for key, names in (("rollout.opponent", (r.opponent,)), ("eval.opponents", e.opponents)):
        for name in names:
            try:
                PolicySpec.parse(name)
            except ValueError as err:
                raise ValueError(f"{key}: {err}") from None
    _check_games(c)
    eval_env_ids = tuple(e.env_ids) or tuple(c.games.env_ids)
    _check_scripted_opponents(c, eval_env_ids)
    for key, n in (("eval.games", e.games), ("eval.final_games", e.final_games)):
        if n < 0 or n % 2:
            raise ValueError(f"{key}={n}: evaluation plays each matchup from both seats equally; give an even "
                             f"number of games (0: none)")
    if not str(c.out_dir).strip():
        raise ValueError("out_dir is empty; give the folder the run writes to (e.g. --config.out_dir=runs/NAME)")
    if others := [o for o in e.opponents if kind(o) not in WEIGHTLESS]:
        raise ValueError(f"eval.opponents: {others[0]!r} is not random, scripted, self or openai:MODEL@URL, the "
                         f"players a run evaluates against (a model folder plays in `spiral-jax eval --opponents "
                         f"NAME=FOLDER`); give a tuple, e.g. --config.eval.opponents='(\"random\", \"scripted\")'")
    if m.every and not m.files:
        raise ValueError("eval.math.every needs eval.math.files: the benchmarks to run, as (\"NAME=items.jsonl\", ...)")
    tok, (model, model_source) = c.tokenizer, _model(c, planning)
    _check_together(c, model, model_source, planning)
    return RunSpec(
        seed=c.seed, out_dir=c.out_dir, model=model, model_source=model_source, model_path=c.model.path,
        random_shape=c.model.random.to_dict(), lora_merged=c.model.lora.sample == "merged",
        tokenizer_path=str(EMBEDDED_TOKENIZER) if tok.path == "embedded" else (tok.path or c.model.path),
        template=Template(tok.template, tok.instruction, tok.suffix, tok.enable_thinking),
        mesh=c.mesh.to_dict(), distributed=DistributedSetup(**c.distributed.to_dict()),
        games=Games(tuple(c.games.env_ids), tuple(c.games.weights), c.games.max_turns, tuple(c.games.invalid_rewards)),
        rollout=RolloutSpec(r.mode, r.opponent, r.pool_size, r.pool_every, r.pool_self_weight, r.games_per_batch,
                            r.samples_per_step, r.selection, r.max_prompt_len, r.schedule, r.max_in_flight or None,
                            SamplingParams(r.max_new_tokens, r.temperature, r.top_k, r.top_p)),
        # Evaluation samples with top-p only, as the reference does.
        evaluation=EvalSpec(
            eval_env_ids, tuple(e.opponents), e.games, e.final_games, tuple(e.invalid_rewards), e.kuhn_samples,
            next((g for g in c.games.env_ids if g == "KuhnPokerChips-v0"), KUHN_ENV_ID),
            SamplingParams(e.max_new_tokens, e.temperature, 0, e.top_p, greedy=e.temperature == 0),
            MathSpec(m.every, tuple(m.files), m.samples, m.limit or None, m.instruction_first,
                     SamplingParams(m.max_new_tokens, m.temperature, 0, m.top_p, greedy=m.temperature == 0))),
        train=train_config(c.optim),
        cadence=Cadence(t.steps, t.eval_every, t.checkpoint_every, t.keep, t.async_checkpointing, t.transcripts,
                        t.max_skipped_in_a_row),
        bootstrap=_bootstrap(c), rae=RAEConfig(c.rae.decay, c.rae.enabled, c.rae.drop_zero, c.rae.games_per_shard),
        api=c.api.to_dict(), wandb=c.wandb.to_dict(), config=c.to_dict(), config_json=c.to_json(indent=1),
        config_file=config_file, compile_ahead=c.compile_ahead)
