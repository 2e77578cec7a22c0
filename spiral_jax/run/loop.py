"""The self-play trainer: rollout -> RAE -> update, with evaluations, metrics and checkpoints.

One step: hand the parameters to the sampler (a jitted reshard when the layouts differ), collect the
step's games and samples (`run.collect`), pack them and run the jitted update (`rl.train_step`).
Every step is seeded by (seed, step) alone, so a resumed run repeats the uninterrupted one exactly.
The loop evaluates at step 0, every `eval_every` steps and at the end (`run.evaluate`), saves the
`RunState` every `checkpoint_every` steps, and on SIGTERM/SIGINT saves at the next safe point and
stops (exit status PREEMPTED_EXIT_CODE). A configured imitation bootstrap runs first (`run.imitation`).

Multi-host: every host runs this same loop. Each samples its share of the games on its own chips
(`host_local_mesh`), the finished games are exchanged (`Rollout.play`), and from there all hosts
compute the same RAE baselines, samples and batch; the update is one SPMD program over every chip.
Only process 0 prints, writes TensorBoard events and transcripts.
"""
from __future__ import annotations

import signal
import time

import jax
import numpy as np
from tqdm import tqdm

from spiral_jax.api_player import ApiPlayer
from spiral_jax.checkpoint import Checkpointer
from spiral_jax.compilation import compile_count
from spiral_jax.config import config_changes
from spiral_jax.distributed import host_local_mesh, initialize, is_leader, to_host_local
from spiral_jax.eval.benchmarks import local_files
from spiral_jax.metrics import MetricsWriter, check_wandb, prune_events
from spiral_jax.models import load_policy_weights, lora
from spiral_jax.paths import replace_text, run_path
from spiral_jax.policies import PolicySpec, kind
from spiral_jax.rl.reshard import make_policy, make_reshard, sample_config, split_frozen
from spiral_jax.rl.samples import pack, per_row, row_multiple, shard_batch
from spiral_jax.rl.train_step import init_train_state, make_update
from spiral_jax.rollout import Rollout
from spiral_jax.run.collect import Collected, collect
from spiral_jax.run.evaluate import evaluate_math, evaluate_policy
from spiral_jax.run.imitation import imitate
from spiral_jax.run.metrics import StepTimes, step_scalars, trained_tokens
from spiral_jax.run.build import (base_files, base_fingerprint, build_model, build_tokenizer, check_lora_alpha,
                                  check_lora_base, eval_context)
from spiral_jax.run.setup import run_spec
from spiral_jax.run.spec import RunSpec
from spiral_jax.run.state import RunState
from spiral_jax.run.summary import RunSummary
from spiral_jax.sharding import batch_shards, make_mesh

_CHANGES_SHOWN = 12  # config changes a resumed run lists in its log

# The exit status of a run stopped by SIGTERM/SIGINT after saving (EX_TEMPFAIL): requeue it with --resume.
PREEMPTED_EXIT_CODE = 75


class TrainingDiverged(FloatingPointError):
    """Too many updates in a row were skipped for a non-finite loss or gradients."""


class Trainer:
    """One run: its spec, its `state` (a RunState) and the objects that act on it."""

    def __init__(self, spec: RunSpec, resume: bool = False, log=print, bootstrap: bool = True, tokenizer=None):
        """tokenizer: one to use instead of the spec's (`build_tokenizer`), e.g. a stand-in that lets a
        benchmark play at a real model's size with random weights and no download. bootstrap=False
        starts RL at once even where the spec has an imitation bootstrap."""
        self.spec, r = spec, spec.rollout
        seats = {(o, "eval"): spec.evaluation.sampling for o in spec.evaluation.opponents if kind(o) == "api"}
        if r.mode == "fixed_opponent" and kind(r.opponent) == "api":
            seats[r.opponent, "rollout"] = r.sampling
        for (name, _), sampling in seats.items():  # a dead endpoint or a refused move fails now, not mid-run
            ApiPlayer.playing(name, sampling, spec.api).check()
        m = spec.evaluation.math
        self.math_files = local_files(m.files) if m.every else {}  # checked now, not mid-run
        initialize(spec.distributed)
        if is_leader():  # the one process that mirrors to W&B
            check_wandb(spec.wandb)
        self.started = time.perf_counter()  # the run's wall time counts setup and bootstrap too
        self.log = log if is_leader() else (lambda *a, **k: None)
        self.out = run_path(spec.out_dir)  # local or gs://, for every file the run writes
        self.mesh = make_mesh(**spec.mesh)
        self.sample_mesh = host_local_mesh(self.mesh)
        # Checked before the weights are loaded: a micro-batch that does not split, a missing tokenizer.
        self.rows = row_multiple(spec.train.micro_batch_size, batch_shards(self.mesh),
                                 r.samples_per_step if r.selection == "exact" else None)
        self.tokenizer = tokenizer or build_tokenizer(spec, spec.model)
        self.cfg, params = build_model(spec, self.mesh)
        self.samples_per_row = per_row(spec.train.samples_per_row, self.cfg, self.mesh.devices.flat[0].platform)
        # With LoRA the weights are frozen and the adapters trained; the sampler, evaluation and
        # opponents see `sample_cfg`: the merged model, or the adapters beside the weights.
        self.weights, params = split_frozen(self.cfg, params, self.mesh)
        self.sample_cfg = sample_config(self.cfg, spec.lora_merged)
        self.full_params = make_policy(self.cfg, self.mesh, spec.lora_merged)
        self.to_sample_layout = make_reshard(self.sample_cfg, self.mesh)
        self.sampler = spec.sampler(self.sample_cfg, self.sample_mesh)
        self.rollout = Rollout(self.sampler, self.tokenizer, r.sampling, invalid_rewards=spec.games.invalid_rewards,
                               max_turns=spec.games.max_turns, max_in_flight=r.max_in_flight, schedule=r.schedule,
                               api=spec.api)
        self.eval_ctx = eval_context(spec, self.sample_cfg, None, self.tokenizer, self.sample_mesh,
                                     sampler=self.sampler)
        self.update = make_update(self.cfg, spec.train, self.mesh, ahead=self.sampler.ahead)
        self.frozen = self._frozen_opponent()
        new_lora = self.cfg.lora_rank and not resume  # a resume checks the checkpoint's LoRA base instead
        files = base_files(spec) if new_lora else None  # taken before the files are hashed
        self.state = RunState(init_train_state(params, self.cfg, spec.train, self.mesh),
                              lora_base=base_fingerprint(spec) if new_lora else None, lora_base_files=files,
                              phase="bootstrap" if spec.bootstrap and bootstrap and not resume else "rl")
        self.summary = RunSummary(self.out / "summary.json", write=is_leader(), log=self.log, skeleton={
            "config": spec.config_file, "seed": spec.seed, "steps": 0, "wall_time_s": 0.0,
            "bootstrap": {"teacher": spec.bootstrap.teacher if spec.bootstrap else None,
                          "steps": spec.bootstrap.steps if spec.bootstrap else 0},
            "rae": {"enabled": spec.rae.enabled, "games_per_shard": spec.rae.games_per_shard}, "eval": {}})
        self.ckpt = Checkpointer(f"{spec.out_dir.rstrip('/')}/checkpoints", spec.cadence.keep,  # gs:// as is
                                 spec.cadence.async_checkpointing, writer=True)
        self._stop, self.stopped, self.skipped_in_a_row, self.saved_step = False, False, 0, None
        if resume:
            self._restore()
            if is_leader():
                pruned = prune_events(self.out / "tensorboard", self.state.logged_after, self.log)
                if pruned:
                    self.log(f"removed {pruned} TensorBoard value(s) logged past the checkpoint by the stopped run")
        self.wall_before = self.state.wall_time_s  # of the processes before a resume
        # After the restore: a --resume with nothing to resume leaves no file in out_dir.
        self.writer = MetricsWriter(self.out / "tensorboard", wandb=spec.wandb, config=spec.config)

    @classmethod
    def from_config(cls, c, config_file: str = "", **kwargs) -> "Trainer":
        """The trainer of config `c` (read once by `run_spec`)."""
        return cls(run_spec(c, config_file), **kwargs)

    def _frozen_opponent(self) -> dict:
        """{"frozen": params} when the fixed opponent is a model folder (loaded once, never trained)."""
        r = self.spec.rollout
        if r.mode != "fixed_opponent" or not PolicySpec.parse(r.opponent).sampled:
            return {}
        params = load_policy_weights(r.opponent, self.cfg.base(), self.sample_mesh)
        if self.sample_cfg.lora_rank:  # a sampler that applies adapters: give the opponent fresh ones (B = 0)
            params = lora.join(params, lora.init_adapters(self.sample_cfg, jax.random.key(0), self.sample_mesh, "sample"))
        return {"frozen": params}

    # ------------------------------------------------------------------------- the policy, saved

    def policy(self, params):
        """Trained params (train layout) -> the policy's full parameters on the SAMPLE layout (merged
        with the frozen weights under LoRA)."""
        return self.to_sample_layout(self.full_params(params, self.weights))

    def to_sampler(self, params):
        """Trained params (train layout) -> what this host's sampler reads (SAMPLE layout, host-local)."""
        return to_host_local(self.policy(params), self.sample_mesh)

    def _restore(self) -> None:
        kl = bool(self.spec.train.kl_coef)
        # Snapshots a pool of this size would not keep (none outside pool mode) are never read.
        r = self.spec.rollout
        state = RunState.restore(self.ckpt, self.state, self.policy(self.state.train.params), self.log, reference=kl,
                                 pool_keep=r.pool_size if r.mode == "pool" else 0)
        if self.cfg.lora_rank:
            check_lora_alpha(state.config, self.cfg, f"the checkpoint of step {state.step} in {self.ckpt.directory}")
        files = base_files(self.spec) if self.cfg.lora_rank else None  # taken before the files are hashed
        check_lora_base(state.lora_base, state.lora_base_files, state.config, self.spec,
                        f"the checkpoint of step {state.step} in {self.ckpt.directory}")
        state.lora_base_files = files  # as checked: the next checkpoint's record
        self.state, self.saved_step = state, state.step
        changes = config_changes(state.config, self.spec.config_json)
        if changes:
            self.log(f"resuming with {len(changes)} config value(s) other than the checkpoint's: "
                     + "; ".join(changes[:_CHANGES_SHOWN])
                     + (f"; and {len(changes) - _CHANGES_SHOWN} more" if len(changes) > _CHANGES_SHOWN else ""))
        if state.phase == "bootstrap":
            self.log(f"resumed from {self.ckpt.directory} in the bootstrap, after {state.bootstrap_step} "
                     f"of {self.spec.bootstrap.steps if self.spec.bootstrap else 0} steps")
            return
        if kl and state.reference is None:
            self.log(f"checkpoint step {state.step} holds no KL reference (it was written with "
                     f"optim.kl_coef=0): the KL penalty is taken against the policy of step {state.step}")
        self.log(f"resumed from {self.ckpt.directory} at step {state.step}")

    def wall_time(self) -> float:
        """The run's wall time so far: this process's, and that of the processes before a resume up to
        the checkpoint it resumed from."""
        return self.wall_before + time.perf_counter() - self.started

    def save(self) -> None:
        """Checkpoint the run's state (part-way through the bootstrap, or at an RL step)."""
        start = time.perf_counter()
        if self.state.phase == "rl":
            self._kl_reference()
        self.state.wall_time_s = self.wall_time()
        self.state.save(self.ckpt, self.spec.seed, self.spec.config_json)
        self.writer.scalars(self.state.step, {"time/checkpoint": time.perf_counter() - start})  # async: blocking part
        self.saved_step = self.state.step

    def _kl_reference(self):
        """The frozen policy of the KL penalty (None without one): a copy of the parameters the first
        time RL needs it, i.e. the policy at step 0; a resumed run restores it from the checkpoint."""
        if self.spec.train.kl_coef and self.state.reference is None:
            self.state.reference = jax.tree.map(lambda x: x.copy(), self.state.train.params)
        return self.state.reference

    def stop_requested(self) -> bool:
        """Whether any host was asked to stop: every host stops at the same step, so the checkpoint
        they write together is whole."""
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            flags = multihost_utils.process_allgather(np.array([self._stop], np.int32))
            self._stop = bool(np.any(flags))
        return self._stop

    def request_stop(self, signum=None, frame=None):
        self._stop = True
        self.log(f"\nreceived signal {signum}: saving a checkpoint at the next safe point (after this "
                 f"step, bootstrap step or evaluation), then exiting")

    # ------------------------------------------------------------------------------------- steps

    def collect(self, params=None) -> Collected:
        """The current step's games and samples with `params` (sampler layout; default the current
        policy's), leaving the run's state as it is."""
        s = self.state
        policies = {"model": self.to_sampler(s.train.params) if params is None else params, **self.frozen,
                    **{f"pool/{step}": to_host_local(p, self.sample_mesh) for step, p in zip(s.pool_steps, s.pool)}}
        opponent = "frozen" if self.frozen else self.spec.rollout.opponent
        return collect(self.spec, self.rollout, policies, s.step, s.rae, s.pool_steps, opponent)

    def pack_samples(self, samples):
        """A step's samples as the train step's batch (on the host), `samples_per_row` at most to a
        row, in whole micro-batches: one a row under "exact" selection is exactly samples_per_step
        rows; otherwise the rows they fill, in a bucketed count."""
        exact = self.spec.rollout.selection == "exact" and self.samples_per_row == 1
        return pack(samples, row_multiple=self.rows, bucket_rows=not exact, samples_per_row=self.samples_per_row)

    def train_step(self) -> dict:
        """One RL step on the state; returns the step's scalars."""
        s, r = self.state, self.spec.rollout
        t0, executables0 = time.perf_counter(), compile_count()
        sample_params = self.to_sampler(s.train.params)
        jax.block_until_ready(sample_params)
        t_handover = time.perf_counter() - t0
        collected = self.collect(sample_params)
        s.rae = collected.rae
        t_rollout = time.perf_counter() - t0 - t_handover

        t1 = time.perf_counter()
        batch = shard_batch(self.pack_samples(collected.samples), self.mesh)
        s.train, epochs = self.update(s.train, batch, self._kl_reference(), self.weights)
        update = jax.device_get(epochs[-1])
        t_update = time.perf_counter() - t1

        s.step += 1
        if r.mode == "pool" and s.step % r.pool_every == 0:
            s.pool.append(self.policy(jax.tree.map(lambda x: x.copy(), s.train.params)))
            s.pool_steps.append(s.step)
            del s.pool[:-r.pool_size], s.pool_steps[:-r.pool_size]  # the newest pool_size
        trained = trained_tokens(collected)
        s.totals = {"games": s.totals["games"] + len(collected.games),
                    "sampled_tokens": s.totals["sampled_tokens"] + collected.decode.generated_tokens,
                    "trained_tokens": s.totals["trained_tokens"] + trained}
        times = StepTimes(time.perf_counter() - t0, t_handover, t_rollout, t_update)
        return step_scalars(collected, trained, update, times, s.totals, s.rae, compile_count() - executables0)

    def eval_context(self):
        """The evaluation context of the current policy (`run.setup.eval_context`)."""
        self.eval_ctx = self.eval_ctx.at(self.to_sampler(self.state.train.params), self.state.step)
        return self.eval_ctx

    def evaluate(self, n_games: int, transcripts: int = 0) -> tuple[dict, object]:
        """The current policy against every configured opponent on every evaluated game, and the
        Kuhn exploitability where configured (`run.evaluate.evaluate_policy`)."""
        folder = self.out / "eval" / f"step{self.state.step}"
        return evaluate_policy(self.eval_context(), self.spec, n_games, folder, self.writer, transcripts, self.log)

    def evaluate_math(self) -> list:
        """The math benchmarks of eval.math (none unless eval.math.every), on the leader."""
        if not self.math_files:
            return []
        ctx = self.eval_context()  # on every host: the weights are gathered to each host's sampler
        folder = self.out / "eval" / f"step{self.state.step}" / "math"
        return evaluate_math(ctx, self.spec, self.math_files, folder, self.writer, self.log)

    # --------------------------------------------------------------------------------- the loop

    def _check_skipped(self, metrics: dict) -> None:
        """Say so when an update was skipped for a non-finite loss or gradients; stop the run when
        `train.max_skipped_in_a_row` are skipped in a row (the parameters stay the last good ones)."""
        if not metrics.get("train/skipped"):
            self.skipped_in_a_row = 0
            return
        self.skipped_in_a_row += 1
        limit, step = self.spec.cadence.max_skipped_in_a_row, self.state.step
        self.log(f"\nstep {step}: update skipped, the loss or gradients were not finite "
                 f"({self.skipped_in_a_row} in a row, {int(metrics['train/skipped_total'])} in all)")
        if limit and self.skipped_in_a_row >= limit:
            newest = self.ckpt.latest_step()
            raise TrainingDiverged(
                f"{self.skipped_in_a_row} updates in a row were skipped for a non-finite loss or gradients "
                f"(step {step}); the training has diverged. Lower optim.learning_rate or check the "
                f"data, then resume from the last good checkpoint with --resume "
                f"({'step ' + str(newest) if newest is not None else 'none saved yet: start over'})")

    def run(self) -> dict:
        """Evaluate at step 0 (fresh runs), train to `train.steps`, then print the final evaluation
        table and return its results ({(env id, opponent): GameStats}); both evaluations go to
        out_dir/summary.json. A resume of a finished run whose final evaluation summary.json holds,
        made under the same config, prints that table again and returns {}, as a stopped run does."""
        cad, e, s = self.spec.cadence, self.spec.evaluation, self.state
        handlers = {sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        self._start_banner()
        try:
            if s.phase == "bootstrap":
                imitate(self)
                if self._stop:
                    return self._stopped()
            if s.step >= cad.steps and self.summary.final_recorded(s.step, self.spec.config_json):
                self.log(f"the run finished at step {s.step} and summary.json holds its final evaluation under "
                         f"this config, so nothing is run again (`spiral-jax eval` evaluates a checkpoint anew)")
                self.log(self.summary.table(s.step, e.sampling, self.out / "tensorboard"))
                return {}
            if s.step == 0 and "step0" not in self.summary.read()["eval"]:
                self.log(f"[eval] step 0, before any RL update: {e.final_games} games per opponent")
                self.summary.record_games("step0", 0, *self.evaluate(e.final_games, cad.transcripts))
                self.summary.record_math("step0", self.evaluate_math())
            bar = tqdm(total=cad.steps, initial=s.step, desc="self-play", unit="step", dynamic_ncols=True,
                       disable=not is_leader())
            while s.step < cad.steps and not self.stop_requested():
                metrics = self.train_step()
                self.writer.scalars(s.step, metrics)
                self._check_skipped(metrics)
                bar.update(1)
                bar.set_postfix({"loss": f"{metrics['train/loss']:.4f}",
                                 "invalid": f"{metrics['rollout/all/invalid_rate']:.2f}",
                                 "tokens": f"{metrics['rollout/all/response_tokens']:.0f}",
                                 "s/step": f"{metrics['time/step']:.1f}"})
                if cad.due(cad.eval_every, s.step) and s.step < cad.steps:
                    self.evaluate(e.games, cad.transcripts)
                if cad.due(e.math.every, s.step) and s.step < cad.steps:
                    self.evaluate_math()
                if cad.due(cad.checkpoint_every, s.step):
                    self.save()
                self.writer.flush()
            bar.close()
            if self._stop:
                return self._stopped()
            if self.saved_step != s.step:
                self.save()
            results, kuhn = self.evaluate(e.final_games, cad.transcripts)
            self.summary.record_math("final", self.evaluate_math())
            self.summary.record_games("final", s.step, results, kuhn, wall_time_s=self.wall_time(),
                                      config_json=self.spec.config_json)
            self.log(self.summary.table(s.step, e.sampling, self.out / "tensorboard"))
            self.log(f"done: outputs are in {self.out}: summary.json, checkpoints/ (step {s.step}), "
                     f"tensorboard/, eval/ (reports and transcripts of every evaluation), config.json")
            return results
        finally:
            for sig, h in handlers.items():
                signal.signal(sig, h)
            try:
                self.ckpt.close()  # waits for an async save, which may fail (a full disk) only now
            finally:
                self.writer.close()

    def _start_banner(self) -> None:
        """Say what runs where, and write the resolved config to out_dir/config.json."""
        spec, devices = self.spec, jax.devices()
        source = f"from {spec.model_path}" if spec.model_path else "random init"
        if self.cfg.lora_rank:
            trained = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.state.train.params))
            source += (f"; LoRA rank {self.cfg.lora_rank} on {','.join(self.cfg.lora_targets)}: "
                       f"{trained / 1e6:.2f}M trained, the rest frozen")
        mesh = " ".join(f"{k}={v}" for k, v in self.mesh.shape.items())
        r = spec.rollout
        mode = r.mode + (f" against {r.opponent}" if r.mode == "fixed_opponent" else
                         f" (rollout.opponent={r.opponent} is not played: fixed_opponent plays it)"
                         if r.opponent != "random" else "")
        self.log(f"spiral-jax train {spec.config_file or ''}\n"
                 f"  devices: {len(devices)} x {devices[0].platform} on {jax.process_count()} host(s); mesh {mesh}\n"
                 f"  model: {self.cfg.model_type}, {self.cfg.num_params / 1e6:.2f}M parameters ({source}), "
                 f"compute {self.cfg.compute_dtype}\n"
                 f"  games: {', '.join(spec.games.env_ids)}; rollout {mode}, {spec.cadence.steps} steps\n"
                 f"  out_dir: {self.out} (watch: tensorboard --logdir {self.out / 'tensorboard'})\n"
                 f"  compile cache: {jax.config.jax_compilation_cache_dir or 'off'}")
        if is_leader():
            self.out.mkdir(parents=True, exist_ok=True)
            replace_text(self.out / "config.json", spec.config_json + "\n")
        self.writer.text(self.state.step, "config", "```\n" + spec.config_json + "\n```")

    def _stopped(self) -> dict:
        """After a stop request: make sure the state is checkpointed, wait for the save, return {}."""
        s = self.state
        if s.phase == "rl" and self.saved_step != s.step:
            self.save()
        self.ckpt.wait()
        self.stopped = True
        where = f"step {s.step}" if s.phase == "rl" else f"bootstrap step {s.bootstrap_step}"
        self.log(f"stopped at {where}; checkpoint saved in {self.ckpt.directory}; resume with --resume "
                 f"(exit status {PREEMPTED_EXIT_CODE})")
        return {}
