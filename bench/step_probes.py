"""Timers on a trainer's RL step (bench/rl_step.py): each phase timed less the time JAX spent making
programs in it, each sampler call, decode-engine call, collection and update pass recorded as it goes."""
import threading
import time

import jax
import numpy as np

from device import busy_time
from spiral_jax.rl.train_step import Update
from spiral_jax.sampling import SamplingParams
from spiral_jax.sampling.ahead import WAIT_EVENT
from spiral_jax.sampling.buckets import attention_windows
from step_costs import sample_sizes


class CompileSeconds:
    """Seconds JAX has spent making programs in this process's main thread: tracing them, lowering
    them and XLA's compiling (or loading from the persistent cache), a trace nested in another (a
    jitted function called while tracing) counted once, and waiting for a program that a background
    thread is compiling ahead (`sampling.ahead`). The timers below leave them out: a phase's time is
    that of its programs. Without tracing and lowering, a schedule that meets many new shapes in a
    step (a decode engine's inserts) would have seconds of tracing counted as its prefill. Compiles on
    background threads overlap the main thread's work, so they are counted apart (`ahead`)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration", WAIT_EVENT)

    def __init__(self):
        self.intervals = []
        self.ahead = []  # seconds of XLA's compiling on background threads, one entry a program
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event, duration, **kwargs):
        if event not in self.EVENTS:
            return
        if threading.current_thread() is threading.main_thread():  # reported as it ends
            self.intervals.append((event, time.perf_counter() - duration, duration))
        elif event == self.EVENTS[2]:
            self.ahead.append(duration)

    @property
    def total(self) -> float:
        return busy_time(self.intervals)

    @property
    def xla(self) -> float:
        """XLA's part alone (compiling, or loading from the persistent cache): the rest is Python's."""
        return sum(duration for event, _, duration in self.intervals if event == self.EVENTS[2])


COMPILES = CompileSeconds()


STARTED = time.perf_counter()


def progress(message: str) -> None:
    """A line as a step goes, stamped with the seconds since the bench started: a run cut short by its
    time limit still says how far it got and where its time went."""
    print(f"  [{time.perf_counter() - STARTED:5.0f} s] {message}", flush=True)


def run_timed(fn, *args, **kwargs):
    """(fn's result, its seconds less the program making it did, that making's seconds)."""
    start, compiled = time.perf_counter(), COMPILES.total
    out = fn(*args, **kwargs)
    compiled = COMPILES.total - compiled
    return out, time.perf_counter() - start - compiled, compiled


class SamplerCalls:
    """Every `Sampler.generate` call of the rollout schedule "rounds": prompts, seconds, rows, steps."""

    def __init__(self, s):
        self.sampler, self.generate, self.calls = s, s.generate, []
        s.generate = self._generate

    def _generate(self, params, prompts, sp, seed=0, row_ids=None):
        out, seconds, compiled = run_timed(self.generate, params, prompts, sp, seed=seed, row_ids=row_ids)
        plen, slots = self.sampler._buckets(prompts, sp)
        call = dict(prompts=prompts, sampling=sp, seconds=seconds, rows=out.batch_rows,
                    steps=max(map(len, out.tokens)) - 1, prompt_bucket=plen,
                    windows=attention_windows(plen, slots, self.sampler.first_window))
        self.calls.append(call)
        progress(f"sampler call {len(self.calls)}: {len(prompts)} prompts in {call['rows']} rows (prompt bucket "
                 f"{call['prompt_bucket']}), {call['steps']} decode steps, {seconds:.1f} s"
                 + (f" and {compiled:.1f} s making programs" if compiled >= 0.05 else ""))
        return out


def run_program(s, params, prompts, sp: SamplingParams, budget: int) -> float:
    """Seconds of the program `s.generate(params, prompts, sp)` compiles, run for `budget` new tokens
    (budget 1: the call's prefill and first token, with no recompile: the budget is an argument)."""
    args, static = s._arguments(params, prompts, sp, 0, None)
    args = (*args[:6], np.int32(budget), *args[7:])
    start = time.perf_counter()
    jax.block_until_ready(s._program(*args, **static))
    return time.perf_counter() - start


class EngineCalls:
    """The decode engines of the rollout schedule "continuous": the seconds of their inserts (the
    prefills), and each decode call's seconds, steps, rows live at its start, and the cache those
    rows filled over its steps (slot-tokens read, for the memory floor)."""

    def __init__(self, rollout):
        self.seconds, self.decodes, self.make = 0.0, [], rollout._engine
        rollout._engine = self._engine

    def _engine(self, policy, games):
        e = self.make(policy, games)
        if not getattr(e, "timed", False):
            insert, decode = e.insert, e.decode

            def timed_insert(params, requests):
                def prefill():
                    insert(params, requests)
                    jax.block_until_ready(e.state)

                self.seconds += run_timed(prefill)[1]

            def timed_decode(params):
                live = [s for s, r in enumerate(e.busy) if r is not None]
                before, slot_steps = list(e.lengths), e.stats.slot_steps
                window = e._decode_window()[1] if live else 0
                out, seconds, _ = run_timed(decode, params)
                grew = {s: e.lengths[s] - before[s] for s in live}  # the steps each row was live
                self.decodes.append(dict(seconds=seconds, steps=(e.stats.slot_steps - slot_steps) // e.slots,
                                         rows=len(live), slots=e.slots, window=window,
                                         filled=sum(before[s] * n + n * (n - 1) / 2 for s, n in grew.items())))
                return out

            e.insert, e.decode, e.timed = timed_insert, timed_decode, True
        return e


class Probes:
    """The timers on a trainer's rollout and update (see each class)."""

    def __init__(self, trainer):
        self.calls, self.engines = SamplerCalls(trainer.sampler), EngineCalls(trainer.rollout)
        self.played = Played(trainer)
        self.update = trainer.update = TimedUpdate(trainer.cfg, trainer.spec.train, trainer.mesh,
                                                   trainer.sampler.ahead)

    def reset(self):
        self.calls.calls, self.engines.seconds, self.engines.decodes = [], 0.0, []


class Played:
    """The games of each step's collection (`Trainer.collect`), and the seconds it spent making programs."""

    def __init__(self, trainer):
        self.collect, self.games, self.compiled = trainer.collect, [], 0.0
        trainer.collect = self._collect

    def _collect(self, params=None):
        collected, seconds, self.compiled = run_timed(self.collect, params)
        self.games = collected.games
        tokens = sum(len(t.response_ids) for g in self.games for t in g.model_turns if t.response_ids)
        progress(f"rollout: {len(self.games)} games, {tokens:,} tokens generated, {seconds:.1f} s and "
                 f"{self.compiled:.1f} s making programs")
        return collected


class TimedUpdate(Update):
    """The recipe's `Update` (no KL term), its parts timed apart: PPO's old log-probs, then the epochs;
    it also counts the batch's tokens per row for the FLOPs."""

    def __init__(self, cfg, tc, mesh, ahead):
        if tc.kl_coef:
            raise ValueError("bench/rl_step.py times the recipe's update, which has no KL term; use a "
                             "config with optim.kl_coef=0")
        super().__init__(cfg, tc, mesh, ahead)
        self.seconds = {}

    def __call__(self, state, batch, ref_params=None, frozen=None):
        self.samples = sample_sizes(*jax.device_get((batch.segment_ids, batch.loss_mask)))
        self.slots, self.n_rows = batch.tokens.size, batch.shape[0]
        self.seconds = {}
        return super().__call__(state, batch, ref_params, frozen)

    def logprob_passes(self, state, batch, ref_params, weights):
        if self.tc.on_policy:
            return batch
        self.batch, self.weights = batch, weights  # for a trace of the pass (print_train)
        batch, self.seconds["old log-probs"], compiled = run_timed(
            lambda: jax.block_until_ready(super(TimedUpdate, self).logprob_passes(state, batch, ref_params, weights)))
        progress(f"old log-probs: {self.n_rows} rows of {batch.tokens.shape[1]} slots, "
                 f"{self.seconds['old log-probs']:.1f} s and {compiled:.1f} s making programs")
        return batch

    def epochs(self, state, batch, weights):
        (state, metrics), self.seconds["train"], compiled = run_timed(
            lambda: jax.block_until_ready(super(TimedUpdate, self).epochs(state, batch, weights)))
        progress(f"train: {self.tc.epochs} epochs, {self.seconds['train']:.1f} s and {compiled:.1f} s making programs")
        return state, metrics
