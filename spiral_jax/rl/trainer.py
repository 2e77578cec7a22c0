"""The self-play trainer: rollout -> RAE -> update, with evaluation, metrics and checkpoints.

One step: hand the parameters to the sampler (a jitted reshard when the layouts differ), play batches
of games until enough turn samples exist (the reference's "whole games, then exactly N samples", or
all turns), label them with RAE, pack, and run the jitted update. Every step is seeded by
(seed, step) alone, so a resumed run repeats the uninterrupted one exactly.

Multi-host: every host runs this same loop. Each samples its share of the games on its own chips
(`host_local_mesh`), the finished games are exchanged (`Rollout.play`), and from there all hosts
compute the same RAE baselines, samples and batch; the update is one SPMD program over every chip.
Only process 0 prints, writes TensorBoard events and transcripts.
"""
from __future__ import annotations

import functools
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import jax
import numpy as np
from ml_collections import ConfigDict
from tqdm import tqdm

from spiral_jax.api_player import ApiPlayer
from spiral_jax.checkpoint import Checkpointer
from spiral_jax.compilation import compile_count
from spiral_jax.run.setup import (base_fingerprint, bootstrap_train_config, build_model, build_tokenizer, eval_sampling,
                                  math_sampling, rae_config, rollout_sampling, train_config)
from spiral_jax.distributed import host_local_mesh, initialize, is_leader, to_host_local
from spiral_jax.envs import make
from spiral_jax.eval.games import evaluate, summarize
from spiral_jax.eval.kuhn_policy import ENV_ID as KUHN_ENV_ID
from spiral_jax.eval.benchmarks import local_files
from spiral_jax.eval.suite import EvalContext, cache_size, run_benchmarks, run_kuhn
from spiral_jax.eval.transcripts import write_transcripts
from spiral_jax.metrics import MetricsWriter
from spiral_jax.models import CheckpointError, load_policy_weights, lora
from spiral_jax.policies import PolicySpec, kind
from spiral_jax.paths import run_path, transcript_path
from spiral_jax.rl.bootstrap import imitation_samples
from spiral_jax.rl.rae import baseline_metrics, init_rae_state, label_games
from spiral_jax.rl.reshard import make_policy, make_reshard, sample_config, split_frozen
from spiral_jax.rl.samples import pack, shard_batch
from spiral_jax.rl.step_metrics import step_metrics
from spiral_jax.rl.summary import RunSummary
from spiral_jax.rl.train_step import TrainConfig, init_train_state, make_update
from spiral_jax.rollout import PlayedGame, Rollout
from spiral_jax.sampling import Sampler, bucket_length
from spiral_jax.sampling.scoring import sequence_logprobs
from spiral_jax.sharding import batch_shards, make_mesh

MODES = ("self_play", "fixed_opponent", "pool")


def peak_memory() -> dict[str, float]:
    """Peak bytes in use on this host's first device, in GiB, where the backend reports it (GPU, TPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" not in stats:
        return {}
    return {"memory/peak_gib": stats["peak_bytes_in_use"] / 2**30}


# The exit status of a run stopped by SIGTERM/SIGINT after saving (EX_TEMPFAIL): requeue it with --resume.
PREEMPTED_EXIT_CODE = 75


class TrainingDiverged(FloatingPointError):
    """Too many updates in a row were skipped for a non-finite loss or gradients."""


def transcript(game: PlayedGame) -> str:
    rec = game.record
    lines = [f"{rec.env_id} seed {rec.seed}, seats {game.seats}, rewards {rec.rewards}: {rec.reason}", ""]
    for t in rec.turns:
        lines.append(f"**player {t.player}** -> `{t.action}`{'' if t.valid else ' (invalid)'}\n\n"
                     f"    {t.response.strip()[:500]}")
    return "\n\n".join(lines)


def draw_seats(rng: np.random.Generator, n: int, mode: str, opponent: str, pool_steps: Sequence[int],
               self_weight: float) -> list[tuple[str, str]]:
    """Who plays each of n games, as (seat 0, seat 1) policy names.

    self_play: the model in both seats. fixed_opponent: the model against `opponent`. pool: a game is
    self-play with probability `self_weight` (always while the pool is empty), else the model against
    a snapshot "pool/STEP" drawn uniformly. Against another player the model takes seat 0 in even games
    and seat 1 in odd ones, so it learns both roles.
    """
    seats = []
    for g in range(n):
        if mode == "self_play" or (mode == "pool" and (not pool_steps or rng.random() < self_weight)):
            seats.append(("model", "model"))
            continue
        other = opponent if mode == "fixed_opponent" else f"pool/{pool_steps[int(rng.integers(len(pool_steps)))]}"
        seats.append(("model", other) if g % 2 == 0 else (other, "model"))
    return seats


class Trainer:
    def __init__(self, c: ConfigDict, resume: bool = False, log=print, bootstrap: bool = True,
                 config_file: str = "", tokenizer=None):
        """tokenizer: one to use instead of the config's (`build_tokenizer`), e.g. a stand-in that
        lets a benchmark play at a real model's size with random weights and no download."""
        if c.rollout.mode not in MODES:
            raise ValueError(f"rollout.mode={c.rollout.mode!r}; use one of {', '.join(MODES)}")
        if len(c.games.weights) != len(c.games.env_ids):
            raise ValueError(f"games.weights has {len(c.games.weights)} entries for "
                             f"{len(c.games.env_ids)} games.env_ids")
        for env_id in (*c.games.env_ids, *c.eval.env_ids):
            make(env_id)  # unknown ids fail here, before anything is compiled
        self._check_opponents(c)
        self._check_api_opponents(c)
        if c.eval.math.every and not c.eval.math.files:
            raise ValueError("eval.math.every needs eval.math.files: the benchmarks to run, as "
                             "(\"NAME=items.jsonl\", ...)")
        self.math_files = local_files(c.eval.math.files) if c.eval.math.every else {}  # checked now, not mid-run
        weights = np.asarray(c.games.weights, float)
        if not (np.all(np.isfinite(weights)) and np.all(weights >= 0) and weights.sum() > 0):
            raise ValueError(f"games.weights={tuple(c.games.weights)}: the mixture weights must be "
                             f"non-negative with a positive sum, one per games.env_ids entry")
        initialize(c.distributed)
        self.started = time.perf_counter()  # summary.json's wall time counts setup and bootstrap too
        self.c, self.log = c, (log if is_leader() else (lambda *a, **k: None))
        self.config_file = config_file
        self.out = run_path(c.out_dir)  # local or gs://, for every file the run writes
        self.mesh = make_mesh(**c.mesh)
        self.sample_mesh = host_local_mesh(self.mesh)
        self.cfg, params = build_model(c, self.mesh)
        self.tokenizer = tokenizer or build_tokenizer(c, self.cfg)
        self.tc = train_config(c.optim)
        shards = batch_shards(self.mesh)
        micro = self.tc.micro_batch_size or shards
        if micro % shards or (c.rollout.selection == "exact" and c.rollout.samples_per_step % micro):
            raise ValueError(
                f"optim.micro_batch_size={micro} must be a multiple of the data x fsdp mesh size "
                f"({shards}) and divide rollout.samples_per_step={c.rollout.samples_per_step}")
        r, e = c.rollout, c.eval
        # With LoRA (model.lora.rank > 0) the weights are frozen and the adapters trained; the sampler,
        # evaluation and opponents see `sample_cfg`: the merged model, or the adapters beside the
        # weights (model.lora.sample; rl/reshard.py).
        self.weights, params = split_frozen(self.cfg, params, self.mesh)
        merged = c.model.lora.sample == "merged"
        self.sample_cfg = sample_config(self.cfg, merged)
        self.full_params = make_policy(self.cfg, self.mesh, merged)
        self.base_id = base_fingerprint(c) if self.cfg.lora_rank else None
        self.sampler = Sampler(self.sample_cfg, self.sample_mesh, max_prompt_len=r.max_prompt_len, max_cache_len=cache_size(c))
        self.rollout = Rollout(self.sampler, self.tokenizer, rollout_sampling(c),
                               invalid_rewards=c.games.invalid_rewards, max_turns=c.games.max_turns,
                               max_in_flight=r.max_in_flight or None, schedule=r.schedule, api=c.api.to_dict())
        self.eval_rollout = Rollout(self.sampler, self.tokenizer, eval_sampling(c),
                                    invalid_rewards=e.invalid_rewards, max_turns=c.games.max_turns,
                                    max_in_flight=r.max_in_flight or r.games_per_batch, schedule=r.schedule,
                                    api=c.api.to_dict())
        self.rae = rae_config(c)
        self.update = make_update(self.cfg, self.tc, self.mesh)
        self.to_sample_layout = make_reshard(self.sample_cfg, self.mesh)
        self.state = init_train_state(params, self.cfg, self.tc, self.mesh)
        self.reference = None  # with optim.kl_coef: the frozen policy RL started from (_kl_reference)
        self.rae_state, self.pool, self.pool_steps, self.step = init_rae_state(), [], [], 0
        self.totals = {"games": 0, "sampled_tokens": 0, "trained_tokens": 0}  # since step 0, resumes included
        self.summary = RunSummary(self.out / "summary.json", write=is_leader(), skeleton={
            "config": config_file, "seed": c.seed, "steps": 0, "wall_time_s": 0.0,
            "bootstrap": {"teacher": c.bootstrap.teacher if c.bootstrap.enabled else None,
                          "steps": c.bootstrap.steps if c.bootstrap.enabled else 0},
            "rae": {"enabled": c.rae.enabled, "games_per_shard": c.rae.games_per_shard}, "eval": {}})
        self.writer = MetricsWriter(self.out / "tensorboard", wandb=c.wandb.to_dict(), config=c.to_dict())
        self.ckpt = Checkpointer(f"{c.out_dir.rstrip('/')}/checkpoints", c.train.keep,  # gs:// kept as is
                                 c.train.async_checkpointing)
        self._stop, self.stopped, self.skipped_in_a_row, self.saved_step = False, False, 0, None
        self.frozen = self._frozen_opponent()
        # The bootstrap runs in run(), under the signal handlers; None: no bootstrap (left) to do.
        self.bootstrap_state, self.bootstrap_done = None, 0
        if resume:
            self._restore()
        elif c.bootstrap.enabled and bootstrap:
            self.bootstrap_state = self.state

    @staticmethod
    def _check_opponents(c: ConfigDict) -> None:
        """Scripted players need a game that lists its legal moves: TextArena games judge free-text
        moves themselves, so there only model players (the trained one, a frozen one) can play."""
        scripted = [("eval.opponents", env_id, o) for env_id in (tuple(c.eval.env_ids) or tuple(c.games.env_ids))
                    for o in c.eval.opponents if kind(o) == "scripted"]
        if c.rollout.mode == "fixed_opponent" and kind(c.rollout.opponent) == "scripted":
            scripted += [("rollout.opponent", env_id, c.rollout.opponent) for env_id in c.games.env_ids]
        for key, env_id, opponent in scripted:
            env = make(env_id)
            env.reset(0)
            if not env.legal_actions():
                raise ValueError(f"{key}: the {opponent} player needs a game that lists its legal moves, and "
                                 f"{env_id} does not; evaluate it against model players only (e.g. "
                                 f"--config.eval.opponents='()' and `spiral-jax eval --opponents self`)")

    @staticmethod
    def _check_api_opponents(c: ConfigDict) -> None:
        """Reach every API opponent (openai:MODEL@URL) once: a dead endpoint or a refused key is an error
        before anything is compiled, not a run of invalid moves."""
        specs = {o for o in c.eval.opponents if kind(o) == "api"}
        if c.rollout.mode == "fixed_opponent" and kind(c.rollout.opponent) == "api":
            specs.add(c.rollout.opponent)
        for spec in sorted(specs):
            ApiPlayer.from_spec(spec, **c.api.to_dict()).check()

    def _frozen_opponent(self) -> dict:
        """{"frozen": params} when the fixed opponent is a model folder (loaded once, never trained)."""
        r = self.c.rollout
        if r.mode != "fixed_opponent" or not PolicySpec.parse(r.opponent).sampled:
            return {}
        if not Path(r.opponent).is_dir():
            raise FileNotFoundError(f"rollout.opponent={r.opponent!r} is neither 'random', 'scripted', an API "
                                    "model (openai:MODEL@URL) nor a model folder; give a Hugging Face "
                                    "checkpoint folder with the model's architecture (e.g. one written by "
                                    "spiral-jax export)")
        params = load_policy_weights(r.opponent, self.cfg.base(), self.sample_mesh)
        if self.sample_cfg.lora_rank:  # a sampler that applies adapters: give the opponent fresh ones (B = 0)
            params = lora.join(params, lora.init_adapters(self.sample_cfg, jax.random.key(0), self.sample_mesh, "sample"))
        return {"frozen": params}

    # ----------------------------------------------------------------------------- checkpoints

    def _restore(self):
        state, pool, meta = self.ckpt.restore(None, self.state, self.policy(self.state.params), log=self.log)
        if meta.get("lora_base") != self.base_id:
            raise CheckpointError(
                f"the checkpoint in {self.ckpt.directory} was trained on other frozen weights "
                f"({meta.get('lora_base') or 'none: full fine-tuning'}) than this run's ({self.base_id or 'none: full fine-tuning'}); "
                f"resume with the model.path and model.lora it was written with")
        self.state, self.pool = state, pool
        self.rae_state, self.pool_steps, self.step = meta["rae"], meta["pool_steps"], meta["step"]
        self.totals = meta.get("totals", self.totals)
        self.saved_step = self.step
        if self.tc.kl_coef and meta.get("phase") != "bootstrap":
            if meta.get("reference"):
                self.reference = self.ckpt.restore_reference(self.step, self.state.params)
            else:
                self.log(f"checkpoint step {self.step} holds no KL reference (it was written with "
                         f"optim.kl_coef=0): the KL penalty is taken against the policy of step {self.step}")
        if meta.get("phase") == "bootstrap":  # stopped during the bootstrap: `state` is its state
            self.bootstrap_state, self.bootstrap_done = state, meta["bootstrap_step"]
            self.log(f"resumed from {self.ckpt.directory} in the bootstrap, after {self.bootstrap_done} "
                     f"of {self.c.bootstrap.steps} steps")
        else:
            self.log(f"resumed from {self.ckpt.directory} at step {self.step}")

    def save(self, bootstrap_step: int | None = None):
        """Checkpoint the RL state, or (with `bootstrap_step`) the bootstrap's state part-way."""
        meta = dict(step=self.step, seed=self.c.seed, rae=self.rae_state, pool_steps=self.pool_steps,
                    config=self.c.to_json(), totals=self.totals, phase="rl" if bootstrap_step is None else "bootstrap",
                    bootstrap_step=bootstrap_step or 0, lora_base=self.base_id)
        state = self.state if bootstrap_step is None else self.bootstrap_state
        start = time.perf_counter()
        reference = self._kl_reference() if bootstrap_step is None else None
        self.ckpt.save(self.step, state, self.pool, meta, reference)
        self.writer.scalars(self.step, {"time/checkpoint": time.perf_counter() - start})  # async: the blocking part
        self.saved_step = self.step

    def _kl_reference(self):
        """The frozen policy of the KL penalty (None without one): a copy of the parameters the first
        time RL needs it, i.e. the policy at step 0; a resumed run restores it from the checkpoint."""
        if self.tc.kl_coef and self.reference is None:
            self.reference = jax.tree.map(lambda x: x.copy(), self.state.params)
        return self.reference

    def stop_requested(self) -> bool:
        """Whether any host was asked to stop: every host stops at the same step, so the checkpoint
        they write together is whole."""
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            flags = multihost_utils.process_allgather(np.array([self._stop], np.int32))
            self._stop = bool(np.any(flags))
        return self._stop

    def policy(self, params):
        """Trained params (train layout) -> the policy's full parameters on the SAMPLE layout (merged
        with the frozen weights under LoRA)."""
        return self.to_sample_layout(self.full_params(params, self.weights))

    def to_sampler(self, params):
        """Trained params (train layout) -> what this host's sampler reads (SAMPLE layout, host-local)."""
        return to_host_local(self.policy(params), self.sample_mesh)

    # ------------------------------------------------------------------------------- bootstrap

    def _bootstrap(self) -> None:
        """Imitation of the configured teacher (see rl/bootstrap.py), then a fresh optimiser for RL.

        A stop request saves the bootstrap's state part-way (the checkpoint's phase "bootstrap"),
        and the end of the bootstrap is checkpointed as step 0, so a resumed run never redoes it."""
        b, c = self.c.bootstrap, self.c
        tc = bootstrap_train_config(c)
        update = make_update(self.cfg, tc, self.mesh)
        if self.bootstrap_done == 0:  # the optimiser's tree is the RL one's, so both share a checkpoint slot
            self.bootstrap_state = init_train_state(self.bootstrap_state.params, self.cfg, tc, self.mesh)
        state = self.bootstrap_state
        what = {"random": "uniformly random legal moves (the answer format, no strategy)",
                "hashed": "a random move distribution fixed per observation (no strategy)",
                "legal": "any legal move, the model's own choice (the answer format, no strategy)",
                "scripted": "the scripted players (imitation of a strategic teacher)"}
        if b.teacher not in what:
            raise ValueError(f"bootstrap.teacher={b.teacher!r}; use one of {', '.join(what)}")
        self.log(f"[bootstrap] {b.steps} imitation steps of {what[b.teacher]}; real checkpoints skip this stage")
        bar = tqdm(range(self.bootstrap_done, b.steps), desc="bootstrap", unit="step", dynamic_ncols=True,
                   disable=not is_leader(), initial=self.bootstrap_done, total=b.steps)
        for i in bar:
            if self.stop_requested():
                self.bootstrap_state, self.bootstrap_done = state, i
                self.save(bootstrap_step=i)
                return
            score = functools.partial(sequence_logprobs, self.full_params(state.params, self.weights), self.sample_cfg)
            samples = imitation_samples(c.games.env_ids, c.games.weights, self.tokenizer, b.batch_size,
                                        seed=c.seed * 1_000_003 + i, explore=b.explore,
                                        teacher=b.teacher, score=score, hash_seed=c.seed,
                                        hash_uniform=b.hash_uniform, targets=b.targets)
            multiple = self._row_multiple(tc)
            rows = -(-bucket_length(len(samples), 1) // multiple) * multiple  # few shapes, few compiles
            batch = shard_batch(pack(samples, rows=rows, row_multiple=multiple), self.mesh)
            state, metrics = update(state, batch, frozen=self.weights)
            if i % 10 == 0 or i == b.steps - 1:
                loss = float(metrics[-1]["loss"])
                bar.set_postfix(loss=f"{loss:.3f}")
                self.writer.scalars(i, {"bootstrap/loss": loss})
        bar.close()
        self.state = init_train_state(state.params, self.cfg, self.tc, self.mesh)
        self.bootstrap_state = None
        self.save()

    # -------------------------------------------------------------------------------- rollout

    def _row_multiple(self, tc: TrainConfig) -> int:
        return tc.micro_batch_size or batch_shards(self.mesh)

    def collect(self, params):
        """Games and exactly `samples_per_step` (or all) RAE-labelled turn samples for this step.

        Also counts, in `self.sample_counts`, the model turns played, those dropped for a zero
        advantage, and the labelled samples before the exact selection."""
        r, c = self.c.rollout, self.c
        rng = np.random.default_rng([c.seed, self.step])
        policies = {"model": params, **self.frozen, **{f"pool/{s}": to_host_local(p, self.sample_mesh)
                                        for s, p in zip(self.pool_steps, self.pool)}}
        weights = np.asarray(c.games.weights, float) / np.sum(c.games.weights)
        samples, games, turns = [], [], 0
        for round_ in range(1000):
            env_ids = [c.games.env_ids[i] for i in rng.choice(len(weights), r.games_per_batch, p=weights)]
            seats = draw_seats(rng, r.games_per_batch, r.mode, "frozen" if self.frozen else r.opponent,
                               self.pool_steps, r.pool_self_weight)
            played = self.rollout.play(env_ids, seats, policies, seed=int(rng.integers(1 << 31)))
            new, self.rae_state = label_games(played, self.rae_state, self.rae, first=len(games))
            if round_ == 0:
                self._check_prompt_lengths(played)
            turns += sum(1 for g in played for t in g.model_turns if t.policy == "model" and t.response_ids)
            samples += new
            games += played
            if r.selection == "all" or len(samples) >= r.samples_per_step:
                break
        else:
            raise RuntimeError(f"1000 rounds of games gave only {len(samples)} trainable samples")
        self.sample_counts = {"turns": turns, "zero_dropped": turns - len(samples), "candidates": len(samples)}
        if r.selection == "exact":
            keep = np.sort(rng.choice(len(samples), r.samples_per_step, replace=False))
            samples = [samples[i] for i in keep]
        return samples, games

    def _check_prompt_lengths(self, games: list[PlayedGame]) -> None:
        """Fail at once when no prompt of a round fits `rollout.max_prompt_len`: every such turn is an
        invalid move, so no round would ever yield a trainable sample."""
        turns = [t for g in games for t in g.model_turns]
        if turns and all(t.finish_reason == "prompt_too_long" for t in turns):
            shortest = min(len(t.prompt_ids) for t in turns)
            raise ValueError(
                f"every prompt of the first round of games is longer than rollout.max_prompt_len="
                f"{self.c.rollout.max_prompt_len} tokens (the shortest has {shortest}); raise "
                f"rollout.max_prompt_len (e.g. --config.rollout.max_prompt_len={bucket_length(shortest)})")

    # ---------------------------------------------------------------------------------- steps

    def train_step(self) -> dict:
        t0 = time.perf_counter()
        executables0 = compile_count()
        sample_params = self.to_sampler(self.state.params)
        jax.block_until_ready(sample_params)
        t_handover = time.perf_counter() - t0
        before = self.rollout.stats
        samples, games = self.collect(sample_params)
        t_rollout = time.perf_counter() - t0 - t_handover
        sampled = self.rollout.stats - before  # this step's sampling

        t1 = time.perf_counter()
        multiple = self._row_multiple(self.tc)
        rows = None if self.c.rollout.selection == "exact" else \
            -(-bucket_length(len(samples), 1) // multiple) * multiple
        batch = shard_batch(pack(samples, rows=rows, row_multiple=multiple), self.mesh)
        self.state, epochs = self.update(self.state, batch, self._kl_reference(), self.weights)
        metrics = {f"train/{k}": float(v) for k, v in jax.device_get(epochs[-1]).items()}
        t_update = time.perf_counter() - t1

        self.step += 1
        if self.c.rollout.mode == "pool" and self.step % self.c.rollout.pool_every == 0:
            self.pool.append(self.policy(jax.tree.map(lambda x: x.copy(), self.state.params)))
            self.pool_steps.append(self.step)
            if len(self.pool) > self.c.rollout.pool_size:
                del self.pool[0], self.pool_steps[0]

        metrics.update(summarize(games).scalars("rollout/all"))
        for env_id in sorted(set(g.record.env_id for g in games)):
            stats = summarize([g for g in games if g.record.env_id == env_id])
            metrics.update(stats.scalars(f"rollout/{env_id}"))
        model_turns = [t for g in games for t in g.model_turns if t.policy == "model"]
        responses = [t.response for g in games for t in g.record.turns]
        metrics.update({
            "rollout/response_chars": float(np.mean([len(x) for x in responses])) if responses else 0.0,
            "rollout/valid_action_rate": float(np.mean([t.valid for g in games for t in g.record.turns])),
            "rollout/truncation_rate": float(np.mean([t.finish_reason != "stop" for t in model_turns]))
            if model_turns else 0.0,
            "rollout/games": len(games), "rollout/samples": len(samples),
            "rollout/samples_before_selection": self.sample_counts["candidates"],
            "rollout/zero_advantage_dropped": self.sample_counts["zero_dropped"] / max(self.sample_counts["turns"], 1),
            "time/step": time.perf_counter() - t0, "time/sampling": sampled.seconds,
            "time/env": t_rollout - sampled.seconds, "time/update": t_update, "time/handover": t_handover,
            "throughput/sampled_tokens_per_s": sampled.tokens_per_s,
            # Decode slots doing useful work, and the share of prompt tokens whose keys were reused.
            "rollout/slot_utilization": sampled.slot_utilization,
            "rollout/prefill_saved": sampled.prefill_saved,
            # Nonzero after the first steps means a shape is not bucketed and a program recompiles.
            "compile/new_executables": compile_count() - executables0,
        })
        trained_tokens = sum(len(x.prompt_ids) + len(x.response_ids) for x in samples)
        self.totals = {"games": self.totals["games"] + len(games),
                       "sampled_tokens": self.totals["sampled_tokens"] + sampled.generated_tokens,
                       "trained_tokens": self.totals["trained_tokens"] + trained_tokens}
        metrics.update({"throughput/trained_tokens_per_s": trained_tokens / max(t_update, 1e-9),
                        "throughput/games_per_s": len(games) / max(t_rollout, 1e-9),
                        **{f"totals/{k}": float(v) for k, v in self.totals.items()}})
        metrics.update(step_metrics(games, samples))
        metrics.update(peak_memory())
        metrics.update(baseline_metrics(self.rae_state))
        return metrics

    def evaluate(self, n_games: int, transcripts: int = 0) -> tuple[dict, object]:
        """The current model against every configured opponent on every training game, and the Kuhn
        exploitability where configured: ({(env id, opponent): GameStats}, KuhnPolicyEstimate | None)."""
        start = time.perf_counter()
        params = self.to_sampler(self.state.params)
        e = self.c.eval
        settings = {"temperature": e.temperature, "top_p": e.top_p, "max_new_tokens": e.max_new_tokens}
        results, scalars = {}, {}
        pairs = [(env_id, opponent) for env_id in self.eval_env_ids for opponent in e.opponents]
        bar = tqdm(pairs, desc=f"eval at step {self.step}", unit="matchup", dynamic_ncols=True, leave=False,
                   disable=not is_leader())
        for env_id, opponent in bar:
            bar.set_postfix_str(f"{env_id} vs {opponent}, {n_games} games")
            api = self.eval_rollout.api_player(opponent) if kind(opponent) == "api" else None
            failed = api.failures if api else 0
            stats, games = evaluate(self.eval_rollout, params, env_id, opponent, n_games,
                                    seed=self.c.seed * 31 + self.step)
            results[env_id, opponent] = stats
            scalars.update(stats.scalars(f"eval/{env_id}/{opponent}"))
            if api:  # moves the API did not answer (each one that player's invalid move)
                scalars[f"eval/{env_id}/{opponent}/api_failures"] = api.failures - failed
            if is_leader():
                write_transcripts(transcript_path(self.out / "eval" / f"step{self.step}", env_id, opponent),
                                  games, extra={"step": self.step, "settings": settings})
            for i, g in enumerate(games[:transcripts]):
                self.writer.text(self.step, f"transcripts/{env_id}/{opponent}/{i}", transcript(g))
        kuhn = None
        if e.kuhn_samples >= 0:  # exploitability of the policy on one-round Kuhn poker
            try:
                kuhn = run_kuhn(self.eval_context(), self.out / "eval" / f"step{self.step}",
                                e.kuhn_samples, env_id=self.kuhn_env_id)
                scalars.update(kuhn.scalars("eval/kuhn"))
            except ValueError as err:  # exact scoring of a model that does not answer that way yet
                self.log(f"[eval] step {self.step}: no Kuhn exploitability: {err}")
        self.writer.scalars(self.step, {**scalars, "time/eval": time.perf_counter() - start})
        return results, kuhn

    def evaluate_math(self) -> list:
        """The math benchmarks of eval.math (none unless eval.math.every), on the leader, logged under
        eval/math/<name>/ and written to eval/step<N>/math/: [BenchmarkResult]."""
        if not self.math_files:
            return []
        start, m = time.perf_counter(), self.c.eval.math
        ctx = self.eval_context()  # on every host: the weights are gathered to each host's sampler
        if not is_leader():
            return []
        self.log(f"[eval] step {self.step}: math benchmarks {', '.join(self.math_files)}")
        results = run_benchmarks(ctx, self.out / "eval" / f"step{self.step}" / "math", self.math_files,
                                 m.samples, limit=m.limit or None, writer=self.writer, step=self.step,
                                 instruction_first=m.instruction_first, prefix="eval/math")
        self.writer.scalars(self.step, {"time/eval_math": time.perf_counter() - start})
        return results

    def eval_context(self) -> EvalContext:
        """What the evaluation suite needs, as a value: the current weights in the sampler layout,
        the tokenizer, the sampler and the eval settings."""
        return EvalContext.from_config(self.c, self.sample_cfg, self.to_sampler(self.state.params), self.tokenizer,
                                       self.sample_mesh, eval_sampling(self.c), math_sampling(self.c),
                                       sampler=self.sampler)

    @property
    def eval_env_ids(self) -> tuple[str, ...]:
        """The games evaluated: eval.env_ids, or the training games when it is empty."""
        return tuple(self.c.eval.env_ids) or tuple(self.c.games.env_ids)

    @property
    def kuhn_env_id(self) -> str:
        """The one-round Kuhn game whose prompts the exploitability is read with: the trained one."""
        return next((g for g in self.c.games.env_ids if g == "KuhnPokerChips-v0"), KUHN_ENV_ID)

    def request_stop(self, signum=None, frame=None):
        self._stop = True
        self.log(f"\nreceived signal {signum}: saving a checkpoint at the next safe point (after this "
                 f"step, bootstrap step or evaluation), then exiting")

    def _check_skipped(self, metrics: dict) -> None:
        """Say so when an update was skipped for a non-finite loss or gradients; stop the run when
        `train.max_skipped_in_a_row` are skipped in a row (the parameters stay the last good ones)."""
        if not metrics.get("train/skipped"):
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row += 1
        limit = self.c.train.max_skipped_in_a_row
        self.log(f"\nstep {self.step}: update skipped, the loss or gradients were not finite "
                 f"({self.skipped_in_a_row} in a row, {int(metrics['train/skipped_total'])} in all)")
        if limit and self.skipped_in_a_row >= limit:
            newest = self.ckpt.latest_step()
            raise TrainingDiverged(
                f"{self.skipped_in_a_row} updates in a row were skipped for a non-finite loss or gradients "
                f"(step {self.step}); the training has diverged. Lower optim.learning_rate or check the "
                f"data, then resume from the last good checkpoint with --resume "
                f"({'step ' + str(newest) if newest is not None else 'none saved yet: start over'})")

    def run(self) -> dict:
        """Evaluate at step 0 (fresh runs), train to `train.steps`, then print and return the final
        evaluation table; both evaluations go to out_dir/summary.json."""
        c = self.c
        handlers = {s: signal.signal(s, self.request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
        self._start_banner()
        try:
            if self.bootstrap_state is not None:
                self._bootstrap()
                if self._stop:
                    return self._stopped()
            if self.step == 0 and "step0" not in self.summary.read()["eval"]:
                self.log(f"[eval] step 0, before any RL update: {c.eval.final_games} games per opponent")
                self.summary.record_games("step0", self.step, *self.evaluate(c.eval.final_games, c.train.transcripts))
                self.summary.record_math("step0", self.evaluate_math())
            bar = tqdm(total=c.train.steps, initial=self.step, desc="self-play", unit="step",
                       dynamic_ncols=True, disable=not is_leader())
            while self.step < c.train.steps and not self.stop_requested():
                metrics = self.train_step()
                self.writer.scalars(self.step, metrics)
                self._check_skipped(metrics)
                bar.update(1)
                bar.set_postfix({"loss": f"{metrics['train/loss']:.4f}",
                                 "invalid": f"{metrics['rollout/all/invalid_rate']:.2f}",
                                 "tokens": f"{metrics['rollout/all/response_tokens']:.0f}",
                                 "s/step": f"{metrics['time/step']:.1f}"})
                if c.train.eval_every and self.step % c.train.eval_every == 0 and self.step < c.train.steps:
                    self.evaluate(c.eval.games, c.train.transcripts)
                if c.eval.math.every and self.step % c.eval.math.every == 0 and self.step < c.train.steps:
                    self.evaluate_math()
                if c.train.checkpoint_every and self.step % c.train.checkpoint_every == 0:
                    self.save()
                self.writer.flush()
            bar.close()
            if self._stop:
                return self._stopped()
            if self.saved_step != self.step:
                self.save()
            results, kuhn = self.evaluate(c.eval.final_games, c.train.transcripts)
            self.summary.record_math("final", self.evaluate_math())
            self.summary.record_games("final", self.step, results, kuhn, wall_s=time.perf_counter() - self.started)
            self.log(self.summary.table(self.step, results, kuhn, c.eval.temperature, c.eval.top_p,
                                        self.out / "tensorboard"))
            self.log(f"done: outputs are in {self.out}: summary.json, checkpoints/ (step {self.step}), "
                     f"tensorboard/, eval/ (transcripts of every evaluation game), config.json")
            return results
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            try:
                self.ckpt.close()  # waits for an async save, which may fail (a full disk) only now
            finally:
                self.writer.close()

    def _start_banner(self) -> None:
        """Say what runs where, and write the resolved config to out_dir/config.json."""
        c, devices = self.c, jax.devices()
        n_params = self.cfg.num_params
        source = f"from {c.model.path}" if c.model.path else "random init"
        if self.cfg.lora_rank:
            trained = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.state.params))
            source += (f"; LoRA rank {self.cfg.lora_rank} on {','.join(self.cfg.lora_targets)}: "
                       f"{trained / 1e6:.2f}M trained, the rest frozen")
        mesh = " ".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        self.log(f"spiral-jax train {self.config_file or ''}\n"
                 f"  devices: {len(devices)} x {devices[0].platform} on {jax.process_count()} host(s); mesh {mesh}\n"
                 f"  model: {self.cfg.model_type}, {n_params / 1e6:.2f}M parameters ({source}), "
                 f"compute {self.cfg.compute_dtype}\n"
                 f"  games: {', '.join(c.games.env_ids)}; rollout {c.rollout.mode}, {c.train.steps} steps\n"
                 f"  out_dir: {self.out} (watch: tensorboard --logdir {self.out / 'tensorboard'})")
        if is_leader():
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_text(c.to_json(indent=1) + "\n")
        self.writer.text(self.step, "config", "```\n" + c.to_json(indent=1) + "\n```")

    def _stopped(self) -> dict:
        """After a stop request: make sure the state is checkpointed, wait for the save, return {}."""
        if self.bootstrap_state is None and self.saved_step != self.step:
            self.save()
        self.ckpt.wait()
        self.stopped = True
        where = f"step {self.step}" if self.bootstrap_state is None else \
            f"bootstrap step {self.bootstrap_done}"
        self.log(f"stopped at {where}; checkpoint saved in {self.ckpt.directory}; resume with --resume "
                 f"(exit status {PREEMPTED_EXIT_CODE})")
        return {}
