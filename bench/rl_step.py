"""One whole RL step of the paper's Kuhn recipe at a real model's size: where the time goes.

The step is the trainer's own (`Trainer.train_step`: hand-over, rollout of self-play Kuhn games, RAE,
selection of exactly `samples_per_step` samples, packing, PPO's old log-probs and its epochs), run
on random weights of a Qwen3 shape with nothing downloaded. The recipe is configs/
spiral_kuhn_qwen3_4b.py (or any --config): 128 samples, up to 4096 new tokens, 2 PPO epochs, bf16
compute (float32 on CPU), remat. Flags cap the sizes so that a run fits a time budget.

Random weights never stop, and a stand-in plays the tokenizer's part:
- stopping: the sampler's logit of the stop token is set, at every step and whatever the weights, so
  that the token is drawn with probability 1/mean (`--mean_tokens`, by default a quarter of the cap:
  1024 for 4096 new tokens). Response lengths are then geometric, cut at the cap: mean 1005 tokens,
  median 710, 1.8% of responses run to the cap of 4096 (invalid moves, as truncated responses are),
  so a sampler call of 64 moves waits for one at the cap more often than not (69%; 44% at 32
  moves). Every run samples the same lengths (the sampler's randomness is seeded); the two rollout
  schedules sample about the same tokens (their games can differ by a few moves). Training scores
  the responses with the unbiased weights, as it would a real policy's.
- text: a prompt is one token per 4 characters of the templated observation (about what Qwen's
  tokenizer gives for English), hashed into the vocabulary, so a game's turns share their prompt's
  head; a response reads as one of the game's move names, picked by its tokens, so about half the
  moves are illegal and end their game, as an untrained base model's often do.

It prints the step's breakdown (prefill, decode, host and games, old log-probs, train), the tokens
generated per second, the decode step against the HBM floor (the weights in the compute dtype plus
the keys and values of every row's prompt bucket and tokens so far, read once per step, over the
memory bandwidth) at batch 1, at batch 2 (the rollout's 2-row program, which XLA builds with fewer
kernels) and at the rollout's batch, the train step's MFU (model FLOPs: 6 x (non-embedding
parameters x tokens + unembedding x response tokens), 4 x for LoRA's frozen weights, plus causal
attention, per epoch, over the device's peak), and the peak memory against `spiral-jax plan`'s estimate. Every phase is timed less
the time JAX spent making programs in it (tracing, lowering, XLA's compiling): the first step
compiles, and a later one may still meet a new bucket. The figures are the last step's (`--steps`,
default 2; `--time_limit` skips the steps that would not end in time, so a run on a borrowed machine
still reports). On a GPU the batch-1 and batch-2 decodes are also traced (jax.profiler): the kernels
a step, the time they keep the GPU busy against the step's time (the rest is launch gaps and host
work), and the kernels that take the most; and so is the old log-probs pass, the forward the epochs
run: its busy time by kind of kernel (matmul, attention, other) and the matmuls' rate, for an MFU
that misses. Bandwidth and peak FLOP/s come from a table of data sheets by device kind, else from
flags, else (CPU) measured here. As a step goes, a line stamped with the seconds since the start
says each sampler call's rows, steps and seconds, the rollout's end, the old log-probs pass and the
epochs, so a run its time limit cuts short still says how far it got.

    python bench/rl_step.py --shape tiny                                    # CPU, seconds
    python bench/rl_step.py --config configs/kuhn_qwen3_4b_1xh200.py --hardware 1xH200   # Qwen3-4B
    python bench/rl_step.py --shape 1.7b --max_new_tokens 1024 --schedule continuous --max_in_flight 32

Decode steps and the cache they read depend on the schedule and the response lengths, not on the
model: `--rollout_only 4b` plays one step's rollout (at any shape, tiny on a CPU) and prices what its
decoding read at Qwen3-4B's sizes and the given bandwidth, to compare schedules without a GPU. It
also packs the samples as the trainer does and says what share of the train step's slots they fill.

Beside this file: step_probes.py times the trainer's phases, step_costs.py counts what a step computes
and reads, device.py gives the device's rates and, on a GPU, its kernels' time.
"""
import argparse
import contextlib
import math
import tempfile
import time
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax import hardware
from spiral_jax import plan as planner
from spiral_jax.config import config_from_file
from spiral_jax.envs import make
from spiral_jax.models import ModelConfig
from spiral_jax.models import transformer
from spiral_jax.models.shapes import QWEN3
from spiral_jax.run import Trainer
from spiral_jax.rl.samples import pack
from spiral_jax.run.setup import run_spec
from spiral_jax.sampling import SamplingParams
from spiral_jax.sampling import engine_programs
from spiral_jax.sampling import sampler as sampler_module
from spiral_jax.templates import Template

from device import device_rates, measured_bandwidth, print_kernels, print_pass_kernels
from step_costs import cache_read, decode_reads, read_sizes, train_flops
from step_probes import COMPILES, STARTED, Probes, run_program, run_timed


ROOT = Path(__file__).resolve().parents[1]
TINY = dict(model_type="qwen3", vocab_size=4096, hidden_size=128, intermediate_size=384, num_layers=2,
            num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=8192,
            rope_theta=1000000.0)
SHAPES = {"tiny": TINY, **QWEN3}
# Sizes of a tiny run (CPU, seconds); real shapes keep the recipe's unless a flag says otherwise.
TINY_SIZES = dict(samples=16, max_new_tokens=128, games=8, micro_batch=8)
BATCH1_STEPS = 128  # decode steps of the batch-1 measurement


# ------------------------------------------------------------------------ the stand-in policy


class StandInTokenizer:
    """What the rollout needs of a tokenizer, for random weights (see the module docstring)."""

    def __init__(self, vocab_size: int, moves: list[str]):
        self.stop_id = vocab_size - 1
        self.stop_ids = frozenset({self.stop_id})
        self.template, self.moves = Template(), moves

    def prompt_ids(self, observation: str) -> list[int]:
        text = self.template.render(observation)
        return [zlib.crc32(text[i:i + 4].encode()) % self.stop_id for i in range(0, len(text), 4)]

    def decode(self, ids) -> str:
        return "\\boxed{%s}" % self.moves[sum(ids) % len(self.moves)]


def game_moves(env_ids, games: int = 20) -> list[str]:
    """Every move name the games offer, from random playouts ("[bet]" -> "bet")."""
    rng, moves = np.random.default_rng(0), set()
    for env_id in env_ids:
        for seed in range(games):
            env = make(env_id)
            env.reset(seed)
            while not env.done:
                legal = env.legal_actions()
                moves.update(legal)
                env.step(legal[rng.integers(len(legal))])
    return sorted(m.strip("[]") for m in moves)


@contextlib.contextmanager
def stop_probability(stop_id: int, mean_tokens: float):
    """Inside: the sampler's and decode engine's logits put probability 1/mean_tokens on `stop_id` at
    every step (at temperature 1 without truncation, the rollout's sampling), whatever the weights.
    Programs traced inside keep it (a Sampler's, and the engine's shared ones): use them only inside."""
    bias = -math.log(mean_tokens - 1)  # p / (1 - p) for p = 1 / mean_tokens
    plain = transformer.unembed

    def unembed(params, cfg, hidden, *args, **kwargs):
        logits = plain(params, cfg, hidden, *args, **kwargs)
        rest = jax.nn.logsumexp(logits.at[..., stop_id].set(-jnp.inf), axis=-1)
        return logits.at[..., stop_id].set(rest + bias)

    sampler_module.unembed = engine_programs.unembed = unembed
    try:
        yield
    finally:
        sampler_module.unembed = engine_programs.unembed = plain


def geometric_lengths(mean_tokens: float, cap: int) -> tuple[float, float]:
    """(mean length, share at the cap) of responses that stop with probability 1/mean per token."""
    keep = 1 - 1 / mean_tokens
    return (1 - keep ** cap) * mean_tokens, keep ** (cap - 1)


# ------------------------------------------------------------------------------------ the run


def bench_config(args):
    """The recipe with the bench's shape, dtype and sizes."""
    c = config_from_file(str(args.config))
    c.model.path = ""
    if args.shape != "config":
        c.model.random.update(**SHAPES[args.shape])
    cpu = jax.default_backend() == "cpu"
    c.model.compute_dtype = args.dtype or ("float32" if cpu else c.model.compute_dtype)
    sizes = {**(TINY_SIZES if args.shape == "tiny" else {}),
             **{k: v for k, v in vars(args).items() if k in TINY_SIZES and v}}
    r = c.rollout
    r.samples_per_step = sizes.get("samples", r.samples_per_step)
    r.max_new_tokens = sizes.get("max_new_tokens", r.max_new_tokens)
    r.games_per_batch = sizes.get("games", r.games_per_batch)
    c.optim.micro_batch_size = sizes.get("micro_batch", c.optim.micro_batch_size)
    if args.samples_per_row is not None:
        c.optim.samples_per_row = args.samples_per_row
    if args.schedule:
        r.schedule = args.schedule
    if args.max_in_flight is not None:
        r.max_in_flight = args.max_in_flight
    if args.decode_attention:
        c.model.decode_attention = args.decode_attention
    if args.compile_ahead is not None:
        c.compile_ahead = args.compile_ahead
    if args.seed is not None:
        c.seed = args.seed
    c.eval.max_new_tokens = r.max_new_tokens  # the sampler is sized by the rollout alone (no evaluation here)
    return c


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "spiral_kuhn_qwen3_4b.py")
    parser.add_argument("--shape", choices=["config", *SHAPES], default="config",
                        help="the model's shape (default: the config's model.random)")
    parser.add_argument("--steps", type=int, default=2, help="steps to run; the last is measured")
    parser.add_argument("--samples", type=int, help="rollout.samples_per_step")
    parser.add_argument("--max_new_tokens", type=int, help="rollout.max_new_tokens (the cap)")
    parser.add_argument("--mean_tokens", type=float, help="mean response length before the cap (default cap/4)")
    parser.add_argument("--games", type=int, help="rollout.games_per_batch")
    parser.add_argument("--micro_batch", type=int, help="optim.micro_batch_size")
    parser.add_argument("--samples_per_row", type=int, help="optim.samples_per_row: the most samples packed "
                        "into a training row (1: a row each; default: the config's, auto)")
    parser.add_argument("--schedule", choices=["rounds", "continuous"], help="rollout.schedule")
    parser.add_argument("--max_in_flight", type=int, help="rollout.max_in_flight")
    parser.add_argument("--decode_attention", choices=["auto", "pallas", "xla"],
                        help="model.decode_attention (pallas: the Pallas decode kernel on a GPU too)")
    parser.add_argument("--compile_ahead", type=int, help="compile_ahead: threads compiling the "
                        "next programs in the background (default: the config's; 0 off)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], help="compute dtype (default: the "
                        "config's, float32 on CPU)")
    parser.add_argument("--bandwidth_tbs", type=float, help="memory bandwidth, TB/s")
    parser.add_argument("--peak_tflops", type=float, help="peak dense FLOP/s in the compute dtype, TFLOP/s")
    parser.add_argument("--hardware", help="the planner's hardware (default: this machine's devices)")
    parser.add_argument("--seed", type=int, help="the config's seed: the games dealt and the tokens drawn")
    parser.add_argument("--rollout_only", choices=SHAPES, metavar="SHAPE",
                        help="play one step's rollout only, and print what its decoding reads and that "
                             "read's floor for SHAPE's bf16 weights (a Qwen3 shape) at --bandwidth_tbs: "
                             "decode steps do not depend on the model, so a tiny run counts them for 4b")
    parser.add_argument("--time_limit", type=float, help="seconds: start no further step that would end "
                        "past this, by the last step's time less its compiling; report the last one run")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be >= 1")

    c = bench_config(args)
    r = c.rollout
    mean_tokens = args.mean_tokens or r.max_new_tokens / 4
    if mean_tokens <= 1:
        parser.error("--mean_tokens must be above 1")
    with tempfile.TemporaryDirectory() as out, stop_probability(c.model.random.vocab_size - 1, mean_tokens):
        c.out_dir = out
        tokenizer = StandInTokenizer(c.model.random.vocab_size, game_moves(c.games.env_ids))
        trainer = Trainer.from_config(c, log=lambda *a, **k: None, tokenizer=tokenizer)
        cfg, devices = trainer.cfg, jax.device_count()
        bandwidth, peak, rates = device_rates(args, jnp.dtype(cfg.compute_dtype))
        mean, capped = geometric_lengths(mean_tokens, r.max_new_tokens)
        d = jax.devices()[0]
        print(f"jax {jax.__version__} on {devices} x {d.platform} ({d.device_kind}); {args.config.name}, "
              f"shape {args.shape}: {cfg.num_params / 1e9:.3f}B parameters, random weights, "
              f"{cfg.compute_dtype}, {cfg.remat_summary}, scan_layers {'on' if cfg.scan_layers else 'off'}")
        print(f"recipe: {r.samples_per_step} samples, up to {r.max_new_tokens} new tokens (stop drawn with "
              f"probability 1/{mean_tokens:g} a token: mean {mean:.0f}, {capped:.1%} at the cap), "
              f"{c.optim.epochs} PPO epochs, {r.games_per_batch} games per call, micro-batch "
              f"{c.optim.micro_batch_size}, {r.schedule} schedule"
              + (f" ({r.max_in_flight} slots)" if r.max_in_flight else ""))
        reads = measured_bandwidth()
        print(f"device: {bandwidth / 1e12:.3g} TB/s, {peak / 1e12:.3g} TFLOP/s ({rates}); a plain reduction "
              f"reads {reads / 1e12:.3g} TB/s here; {trainer.sampler.ahead.workers} threads compile the "
              f"next programs ahead (the sampler's, the train step)")
        probes = Probes(trainer)
        if args.rollout_only:
            print_rollout_reads(trainer, c, probes, args.rollout_only, bandwidth)
            trainer.ckpt.close()
            trainer.writer.close()
            return
        for step in range(1, args.steps + 1):
            probes.reset()
            xla, ahead = COMPILES.xla, len(COMPILES.ahead)
            metrics, _, compiled = run_timed(trainer.train_step)
            background = COMPILES.ahead[ahead:]
            print(f"step {step} of {args.steps}: {metrics['time/step']:.1f} s, of which "
                  f"{compiled:.1f} s tracing and compiling {int(metrics['compile/new_executables'])} programs "
                  f"or waiting for them (XLA's part {COMPILES.xla - xla:.1f} s"
                  + (f"; {len(background)} of the programs compiled ahead on background threads, "
                     f"{sum(background):.1f} s of XLA's compiling there" if background else "") + ")")
            expected = metrics["time/step"] - compiled
            if step < args.steps and not fits(time.perf_counter() - STARTED, expected, args.time_limit):
                print(f"stopping after step {step}: another (about {expected:.0f} s) would end past "
                      f"--time_limit {args.time_limit:g} s")
                break
        report(trainer, c, args, metrics, compiled, probes, bandwidth, peak, reads)
        trainer.ckpt.close()
        trainer.writer.close()


def fits(elapsed: float, expected: float, limit: float | None) -> bool:
    """Whether a step expected to take `expected` seconds, started `elapsed` seconds into the run, ends
    within `limit` (None: no limit). The expectation is a step run without compiling: a later step
    meets few new shapes, while the first one's compiling would make any limit look too short."""
    return limit is None or elapsed + expected <= limit


def report(trainer, c, args, metrics, compiled, probes, bandwidth, peak, reads):
    """Print the last step's figures, less the time spent making programs; the last line sums them up."""
    devices = jax.device_count()
    params = trainer.to_sampler(trainer.state.train.params)
    step = metrics["time/step"] - compiled
    sampling = metrics["time/sampling"] - probes.played.compiled
    print_phases(trainer, c, metrics, compiled, probes, params, step, sampling)
    print_rollout(trainer, c, metrics, probes, sampling)
    batch1 = print_decode(trainer, c, probes, params, bandwidth, reads)
    mfu = print_train(trainer.cfg, c, probes.update, peak, trainer.state.train.params)
    print_memory(c, args, metrics)
    print(f"rl step {step:.1f} s, decode {batch1:.2f}x HBM floor, train MFU {mfu * 100:.0f}%, "
          f"GPU-seconds per step {step * devices:.0f}")


def print_phases(trainer, c, metrics, compiled, probes, params, step, sampling):
    """The step's phases. Prefill: each "rounds" call's program run again for one token (the
    decode is the rest of the call), or the decode engine's inserts."""
    if c.rollout.schedule == "rounds":
        for k in probes.calls.calls:
            k["prefill"] = run_program(trainer.sampler, params, k["prompts"], k["sampling"], 1)
        prefill = sum(k["prefill"] for k in probes.calls.calls)
    else:
        prefill = probes.engines.seconds
    parts = {"prefill": prefill, "decode": sampling - prefill, "host and games": metrics["time/env"],
             **probes.update.seconds}
    parts["hand-over, packing, metrics"] = step - sum(parts.values())
    print(f"\nthe last step{f', less {compiled:.1f} s of tracing and compiling' if compiled else ''}:")
    for name, seconds in parts.items():
        print(f"  {name:28s} {seconds:9.2f} s {seconds / step:6.1%}")
    print(f"  {'step':28s} {step:9.2f} s")


def print_rollout(trainer, c, metrics, probes, sampling):
    r, games = c.rollout, probes.played.games
    lengths = np.array([len(t.response_ids) for g in games for t in g.model_turns if t.response_ids])
    invalid = np.mean([not t.valid for g in games for t in g.record.turns])
    calls = f"{len(probes.calls.calls)} sampler calls" if r.schedule == "rounds" else \
        f"{max(e.slots for e in trainer.rollout.engines.values())} decode slots"
    print(f"rollout: {len(games)} games, {len(lengths)} moves ({invalid:.0%} invalid), {calls}; responses mean "
          f"{lengths.mean():.0f} tokens, median {np.median(lengths):.0f}, longest {lengths.max()} "
          f"({np.sum(lengths >= r.max_new_tokens)} at the cap); {lengths.sum():,} tokens generated at "
          f"{lengths.sum() / sampling:,.0f} tokens/s; slot utilization {metrics['rollout/slot_utilization']:.0%}")


def print_decode(trainer, c, probes, params, bandwidth, reads) -> float:
    """The decode step against the HBM floor at batch 1 (one of the step's prompts, no stop ids,
    BATCH1_STEPS steps less one), at batch 2 (where the rollout made that program) and over the
    rollout's decoding (the sampler's calls of "rounds", the engines' decode calls of "continuous");
    returns the batch-1 ratio."""
    cfg, r, devices = trainer.cfg, c.rollout, jax.device_count()
    weights, kv = read_sizes(cfg, jnp.dtype(cfg.compute_dtype).itemsize)

    def floor(rows, prompt_bucket, steps):
        """Seconds of `steps` decode steps that read the weights and the filled cache once each."""
        return (steps * weights + kv * cache_read(rows, prompt_bucket, steps)) / (bandwidth * devices)

    prompt = next(t.prompt_ids for g in probes.played.games for t in g.model_turns)
    # No stop ids: every step decodes. The rollout's new-token budget, so that the program is the one
    # the rollout ran at batch 1 (or compiled ahead) where it met one: BATCH1_STEPS is an argument.
    one = SamplingParams(max(r.max_new_tokens, BATCH1_STEPS), r.temperature, r.top_k, r.top_p)
    plen = trainer.sampler._buckets([prompt], one)[0]

    def decode_step(prompts) -> tuple[float, float]:
        """Seconds of a decode step of the sampler's program for `prompts`, and its floor."""
        run_program(trainer.sampler, params, prompts, one, 1)  # compiles, unless the rollout did
        times = {n: min(run_program(trainer.sampler, params, prompts, one, n) for _ in range(3))
                 for n in (1, BATCH1_STEPS)}
        step = (times[BATCH1_STEPS] - times[1]) / (BATCH1_STEPS - 1)
        return step, floor(len(prompts), plen, BATCH1_STEPS - 1) / (BATCH1_STEPS - 1)

    step, least_one = decode_step([prompt])
    print(f"decode step at batch 1: {step * 1e3:.2f} ms, HBM floor {least_one * 1e3:.2f} ms "
          f"({weights / 1e9:.3g} GB of {cfg.compute_dtype} weights and the cache at "
          f"{bandwidth * devices / 1e12:.3g} TB/s): {step / least_one:.2f}x; "
          f"{step / least_one * reads / bandwidth:.2f}x at the rate a plain reduction reads")
    gpu = jax.default_backend() == "gpu"
    if gpu:
        print_kernels(lambda n: run_program(trainer.sampler, params, [prompt], one, n), BATCH1_STEPS, step)
    # At one row XLA drops the batch axis: its products become reductions and its RMS norms two kernels
    # each, where from two rows up they are gemms and one fused kernel (bench/decode_program.py). The
    # two-row step, against the same weights, says whether a one-row call should run as two.
    if has_program(trainer.sampler, probes.calls.calls, prompt, one, rows=2):
        two, least2 = decode_step([prompt, prompt])
        print(f"decode step at batch 2: {two * 1e3:.2f} ms, HBM floor {least2 * 1e3:.2f} ms: {two / least2:.2f}x; "
              f"{two / step:.2f}x the batch-1 step")
        if gpu:
            print_kernels(lambda n: run_program(trainer.sampler, params, [prompt, prompt], one, n), BATCH1_STEPS,
                          two)
    else:
        print("decode step at batch 2: not measured, the rollout made no 2-row program for this prompt bucket")
    steps, rows, slot_tokens, window_tokens, seconds = decode_reads(r.schedule, probes)
    least = (steps * weights + kv * slot_tokens) / (bandwidth * devices)
    windowed = (steps * weights + kv * window_tokens) / (bandwidth * devices)
    where = (f"{rows:.0f} rows on average" if r.schedule == "rounds" else
             f"{rows:.0f} live rows of {probes.engines.decodes[0]['slots']} slots at a call's start on average")
    print(f"decode step at the rollout's batch ({where}, {steps} steps): {seconds / steps * 1e3:.2f} ms, "
          f"HBM floor {least / steps * 1e3:.2f} ms: {seconds / least:.2f}x; {seconds / windowed:.2f}x the "
          f"{windowed / steps * 1e3:.2f} ms of its windows' reads (every row its whole attention window)")
    return step / least_one


def print_rollout_reads(trainer, c, probes, shape: str, bandwidth: float) -> None:
    """One step's rollout (`--rollout_only`), and the floor of what its decoding read at `shape`'s sizes."""
    collected, seconds, compiled = run_timed(trainer.collect)
    games, r = probes.played.games, c.rollout
    tokens = sum(len(t.response_ids) for g in games for t in g.model_turns)
    steps, rows, slot_tokens, window_tokens, _ = decode_reads(r.schedule, probes)
    weights, kv = read_sizes(ModelConfig(**SHAPES[shape]), 2)
    least = (steps * weights + kv * slot_tokens) / bandwidth
    windowed = (steps * weights + kv * window_tokens) / bandwidth
    schedule = r.schedule + (f", {r.max_in_flight} slots" if r.schedule == "continuous" else
                             f", {len(probes.calls.calls)} calls")
    print(f"rollout ({schedule}): {len(games)} games, {sum(len(g.model_turns) for g in games)} moves, "
          f"{tokens:,} tokens in {seconds:.1f} s (and {compiled:.1f} s making programs)")
    print(f"decode reads: {steps:,} steps of {rows:.1f} rows on average, {slot_tokens:,.0f} slot-tokens of cache; "
          f"floor at {shape}'s bf16 sizes ({weights / 1e9:.3g} GB of weights, {kv / 1e3:.0f} KB of cache a token) "
          f"and {bandwidth / 1e12:.3g} TB/s: {least:.1f} s, of which weights {steps * weights / bandwidth:.1f} s; "
          f"{least / tokens * 1e3:.2f} s per 1k tokens")
    print(f"read as XLA's attention reads it (every row of a call its whole window, {window_tokens:,.0f} "
          f"slot-tokens): {windowed:.1f} s, {windowed / tokens * 1e3:.2f} s per 1k tokens")
    # The step's training batch as the trainer packs it (`--samples_per_row`), and one sample a row:
    # every row is as long as the longest sample's bucket, so the slots no sample fills are computed
    # and thrown away.
    n = len(collected.samples)
    layouts = [(trainer.samples_per_row, trainer.pack_samples(collected.samples))]
    if trainer.samples_per_row > 1:
        layouts.append((1, pack(collected.samples, row_multiple=trainer.rows)))
    for per_row, batch in layouts:
        real = int(np.sum(batch.segment_ids > 0))
        print(f"train batch, at most {per_row} sample{'s' * (per_row > 1)} a row: {n} samples in {batch.shape[0]} "
              f"rows of {batch.shape[1]:,} slots, {real:,} tokens in them: {real / batch.tokens.size:.0%} of the "
              f"slots the train step computes")


def has_program(sampler, calls, prompt, sp: SamplingParams, rows: int) -> bool:
    """Whether the rollout ran, or compiled ahead, the sampler's program for `rows` rows of prompts in
    `prompt`'s bucket with `sp`'s budget: measuring it then compiles nothing."""
    plen, slots = sampler._buckets([prompt], sp)
    return (((rows, plen), slots, sp.mode) in sampler.ahead
            or any(k["rows"] == rows and k["prompt_bucket"] == plen and k["sampling"].max_new_tokens == sp.max_new_tokens
                   for k in calls))


def print_train(cfg, c, update, peak, params) -> float:
    """The epochs' model FLOPs over their time and the devices' peak: returns the MFU. On a GPU, the
    old log-probs pass (the forward the epochs run, over the same batch) is traced too."""
    devices = jax.device_count()
    epoch = train_flops(cfg, update.samples, 3)
    train_s, logprob_s = update.seconds["train"], update.seconds.get("old log-probs", 0.0)
    mfu = c.optim.epochs * epoch / (train_s * peak * devices)
    tokens, response = (sum(x) for x in zip(*update.samples))
    line = (f"train: {len(update.samples)} samples in {update.n_rows} rows, {tokens:,} tokens "
            f"({tokens / update.slots:.0%} of the batch's "
            f"slots; {response:,} response), {c.optim.epochs} epochs of {epoch:.3g} FLOP in {train_s:.2f} s: "
            f"MFU {mfu:.0%}")
    if logprob_s:
        line += f"; old log-probs {train_flops(cfg, update.samples, 1) / (logprob_s * peak * devices):.0%}"
    print(line)
    if logprob_s and jax.default_backend() == "gpu":
        print_pass_kernels("the old log-probs pass (the epochs' forward)", lambda: jax.block_until_ready(
            update.compute_logprobs(params, update.batch, *update.weights)), logprob_s, train_flops(cfg, update.samples, 1, False))
    return mfu


def print_memory(c, args, metrics):
    hw = hardware.hardware(args.hardware) if args.hardware else hardware.local_hardware()
    p = planner.plan(run_spec(c, planning=True), hw)
    estimate = f"the plan's {p.peak / planner.GiB:.2f} GiB ({p.worst_phase}) on {hw.name}"
    if "memory/peak_gib" in metrics:
        print(f"memory: peak {metrics['memory/peak_gib']:.2f} GiB in use per device against {estimate} "
              f"({metrics['memory/peak_gib'] * planner.GiB / p.peak:.2f}x)")
    else:
        print(f"memory: this backend reports no peak; {estimate}")


if __name__ == "__main__":
    main()
