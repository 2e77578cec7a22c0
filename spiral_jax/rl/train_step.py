"""The jitted update: micro-batched gradients, optax, a NaN/Inf guard, and the PPO epoch loop.

`make_train_step` returns one jitted function (state, batch) -> (state, metrics) with explicit in/out
shardings on the TRAIN layout and the state donated, so parameters and optimiser state are updated in
place. Micro-batches are strided slices of the rows (row i goes to micro-batch i % n), so a row-sharded
batch splits into row-sharded micro-batches without moving data; their fp32 gradients are summed in
a `lax.scan`. Token weights are computed over the whole batch first, so the sum equals the
full-batch gradient exactly.

With LoRA (`cfg.lora_rank > 0`) the trained tree is the adapters alone (`models.lora`): the state, the
optimiser and the gradients hold only them, and every function here takes the frozen weights as
`frozen`, joined with the adapters inside the program.

`epochs == 1` is REINFORCE. `epochs > 1` is the reference's PPO learner: `Update` recomputes the
old log-probs with the current parameters (so epoch 1 is exactly REINFORCE), then takes `epochs`
clipped steps on the same batch.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from spiral_jax.models import ModelConfig, abstract_params, lora, param_shardings
from spiral_jax.rl import losses
from spiral_jax.rl.samples import Batch, batch_shardings
from spiral_jax.sampling.ahead import CompileAhead
from spiral_jax.sharding import Rules, batch_shards, constrain

SCHEDULES = ("constant", "linear", "cosine")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimiser, loss and execution settings. Flat, so `TrainConfig(**config_dict)` works."""

    # optax: clip_by_global_norm(max_grad_norm), then AdamW with the schedule below.
    learning_rate: float = 1e-6
    schedule: str = "constant"  # after warm-up: constant, or linear/cosine decay over decay_steps
    warmup_steps: int = 0
    decay_steps: int = 0
    final_lr_fraction: float = 0.0
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    # Loss.
    epochs: int = 1  # 1: REINFORCE; > 1: PPO with `clip`, old log-probs recomputed by the learner
    clip: float = 0.2
    normaliser: str = "constant"  # see losses.token_weights
    normaliser_constant: float = 4096.0
    tis_cap: float | None = None  # truncated importance weight against the sampler (e.g. 2.0)
    kl_coef: float = 0.0  # KL to a frozen reference (make_update's ref_params)
    # Execution.
    micro_batch_size: int | None = None  # rows per micro-batch (a multiple of the batch shards)
    samples_per_row: int | None = None  # the most samples packed into one row; None: `samples.per_row`
    logprob_chunk: int = 512  # response slots unembedded at a time, at most (`losses.response_chunk`)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; use one of {SCHEDULES}")
        if self.schedule != "constant" and self.decay_steps <= 0:
            raise ValueError(f"schedule={self.schedule!r} needs decay_steps > 0")
        if self.normaliser not in losses.NORMALISERS:
            raise ValueError(f"unknown normaliser {self.normaliser!r}; use one of {losses.NORMALISERS}")
        if self.epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {self.epochs}")
        for name in ("tis_cap", "micro_batch_size", "samples_per_row"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, or None for off / the whole batch")

    @property
    def on_policy(self) -> bool:
        return self.epochs == 1


class TrainState(NamedTuple):
    params: dict
    opt_state: optax.OptState
    step: jax.Array  # applied updates (int32)
    skipped: jax.Array  # updates skipped for NaN/Inf (int32)


def make_schedule(tc: TrainConfig) -> optax.Schedule:
    peak, final = tc.learning_rate, tc.learning_rate * tc.final_lr_fraction
    if tc.schedule == "constant":
        after = optax.constant_schedule(peak)
    elif tc.schedule == "linear":
        after = optax.linear_schedule(peak, final, tc.decay_steps)
    else:
        after = optax.cosine_decay_schedule(peak, tc.decay_steps, alpha=tc.final_lr_fraction)
    if not tc.warmup_steps:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, tc.warmup_steps), after],
                                [tc.warmup_steps])


def make_optimizer(tc: TrainConfig) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(tc.max_grad_norm),
        optax.adamw(make_schedule(tc), b1=tc.b1, b2=tc.b2, eps=tc.eps, weight_decay=tc.weight_decay))


def _trained(cfg: ModelConfig, tree):
    """The part of a full parameter-shaped tree that is trained: the adapters with LoRA, else all."""
    return lora.split(tree)[1] if cfg.lora_rank else tree


def _frozen_shardings(cfg: ModelConfig, rules: Rules) -> tuple:
    """in_shardings of the `frozen` argument: the weights beside LoRA adapters; none without LoRA
    (the jitted functions then take no third argument)."""
    return (lora.split(param_shardings(cfg, rules))[0],) if cfg.lora_rank else ()


def _full(params, frozen):
    return params if frozen is None else lora.join(frozen, params)


def state_shardings(cfg: ModelConfig, tc: TrainConfig, mesh) -> TrainState | None:
    """TrainState of NamedShardings: trained parameters (and Adam moments) on the TRAIN layout."""
    rules = Rules.create(mesh, "train")
    if rules is None:
        return None
    opt = make_optimizer(tc)
    params = _trained(cfg, param_shardings(cfg, rules))
    opt_state = optax.tree_map_params(opt, lambda _, s: s, jax.eval_shape(opt.init, _trained(cfg, abstract_params(cfg))),
                                      params, transform_non_params=lambda _: rules.replicated())
    return TrainState(params, opt_state, rules.replicated(), rules.replicated())


def init_train_state(params, cfg: ModelConfig, tc: TrainConfig, mesh=None) -> TrainState:
    """Optimiser state for the trained `params` (the adapters alone with LoRA), everything placed on
    the TRAIN layout (a no-op if it already is).

    The state takes the arrays over: the train step donates them, so keep no other reference.
    """
    shardings = state_shardings(cfg, tc, mesh)
    opt = make_optimizer(tc)
    if shardings is None:
        return TrainState(params, jax.jit(opt.init)(params), jnp.zeros((), jnp.int32),
                          jnp.zeros((), jnp.int32))  # two buffers: the step donates each one
    params = jax.device_put(params, shardings.params)
    opt_state = jax.jit(opt.init, out_shardings=shardings.opt_state)(params)
    counters = [jax.device_put(jnp.zeros((), jnp.int32), s) for s in (shardings.step, shardings.skipped)]
    return TrainState(params, opt_state, *counters)


def _split(x, n: int):
    """[B, ...] -> [n, B/n, ...]; micro-batch i holds rows i, i + n, i + 2n, ..."""
    return x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1)


def _unsplit(x):
    return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def _micro_batches(batch: Batch, tc: TrainConfig, rules: Rules | None) -> int:
    rows = batch.tokens.shape[0]
    size = tc.micro_batch_size or rows
    shards = batch_shards(None if rules is None else rules.mesh)
    if rows % size or size % shards:
        raise ValueError(f"{rows} rows do not split into micro-batches of {size} rows sharded "
                         f"{shards} ways; pack with row_multiple = micro_batch_size, a multiple of "
                         f"the data x fsdp mesh size")
    return rows // size


def loss_and_grads(params, batch: Batch, cfg: ModelConfig, tc: TrainConfig, rules: Rules | None = None,
                   frozen=None):
    """(loss, fp32 grads of `params`, (logp, entropy, clipped) [B, T]) summed over micro-batches.
    frozen: the weights beside LoRA adapters `params` (None without LoRA)."""
    n = _micro_batches(batch, tc, rules)
    weights = losses.token_weights(batch, tc.normaliser, tc.normaliser_constant)
    micro = jax.tree.map(lambda x: _split(x, n), (batch, weights))
    row_axes = lambda x: constrain(x, rules, ("batch",) + (None,) * (x.ndim - 1))  # noqa: E731

    def micro_loss(params, mb: Batch, w):
        logp, entropy = losses.token_logprobs(_full(params, frozen), cfg, mb, tc.logprob_chunk, rules)
        tok, clipped = losses.token_loss(logp, mb, on_policy=tc.on_policy,
                                         clip=None if tc.on_policy else tc.clip,
                                         tis_cap=tc.tis_cap, kl_coef=tc.kl_coef)
        return jnp.sum(tok * w), (logp, entropy, clipped)

    def body(acc, xs):
        mb, w = jax.tree.map(row_axes, xs)
        (loss, aux), grads = jax.value_and_grad(micro_loss, has_aux=True)(params, mb, w)
        acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, (loss, grads))
        return acc, aux

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if rules is not None:
        zeros = jax.lax.with_sharding_constraint(zeros, _trained(cfg, param_shardings(cfg, rules)))
    (loss, grads), aux = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
    return loss, grads, jax.tree.map(_unsplit, aux)


def _nonfinite(tree) -> jax.Array:
    return sum(jnp.sum(~jnp.isfinite(x)) for x in jax.tree.leaves(tree)).astype(jnp.float32)


def make_train_step(cfg: ModelConfig, tc: TrainConfig, mesh=None):
    """jit((state, batch) -> (state, metrics)); the state is donated. See the module docstring.

    Metrics (replicated fp32 scalars): loss, grad_norm (before clipping), learning_rate, entropy and
    clip_fraction (token means), advantage_mean/min/max (over the samples), drift_mean/max/outside (|learner -
    sampler| log-prob over response tokens, and the share with probability ratio outside [0.9, 1.1];
    on a batch's first epoch the learner's parameters are the sampler's), response_tokens, samples,
    nonfinite_loss/grads/logprobs, skipped (this step) and skipped_total; tis_weight and kl when on.
    """
    rules = Rules.create(mesh, "train")
    opt = make_optimizer(tc)
    schedule = make_schedule(tc)

    def step(state: TrainState, batch: Batch, frozen=None):
        loss, grads, (logp, entropy, clipped) = loss_and_grads(state.params, batch, cfg, tc, rules, frozen)
        nonfinite = _nonfinite(grads)
        ok = jnp.isfinite(loss) & (nonfinite == 0)
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
        new_state = TrainState(jax.tree.map(keep, params, state.params),
                               jax.tree.map(keep, opt_state, state.opt_state),
                               state.step + ok.astype(jnp.int32), state.skipped + (~ok).astype(jnp.int32))
        metrics = losses.loss_metrics(logp, entropy, clipped, batch, on_policy=tc.on_policy,
                                      tis_cap=tc.tis_cap, kl_coef=tc.kl_coef)
        metrics.update(loss=loss, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                       nonfinite_loss=(~jnp.isfinite(loss)).astype(jnp.float32),
                       nonfinite_grads=nonfinite, skipped=(~ok).astype(jnp.float32),
                       skipped_total=new_state.skipped.astype(jnp.float32))
        return new_state, metrics

    if mesh is None:
        return jax.jit(step, donate_argnums=0)
    state_sh = state_shardings(cfg, tc, mesh)
    return jax.jit(step, in_shardings=(state_sh, batch_shardings(mesh), *_frozen_shardings(cfg, rules)),
                   out_shardings=(state_sh, rules.replicated()), donate_argnums=0)


def make_compute_logprobs(cfg: ModelConfig, tc: TrainConfig, mesh=None):
    """jit((params, batch, frozen=None) -> log-probs [B, T], 0 off the response): PPO's old (or a
    frozen reference's) log-probs, computed exactly as the train step computes them."""
    rules = Rules.create(mesh, "train")

    def compute(params, batch: Batch, frozen=None):
        n = _micro_batches(batch, tc, rules)
        full = _full(params, frozen)
        logp = jax.lax.map(
            lambda mb: losses.token_logprobs(full, cfg, mb, tc.logprob_chunk, rules)[0],
            jax.tree.map(lambda x: _split(x, n), batch))
        return jnp.where(batch.loss_mask > 0, _unsplit(logp), 0.0)

    if mesh is None:
        return jax.jit(compute)
    return jax.jit(compute, in_shardings=(_trained(cfg, param_shardings(cfg, rules)), batch_shardings(mesh),
                                          *_frozen_shardings(cfg, rules)),
                   out_shardings=batch_shardings(mesh).loss_mask)


class Update:
    """(state, batch, ref_params=None, frozen=None) -> (state, [metrics per epoch]): one iteration on a
    packed batch (`make_update`).

    With epochs > 1 the old log-probs are first recomputed by the learner; with kl_coef > 0 the
    reference log-probs come from `ref_params` (trained parameters, on the TRAIN layout). frozen: the
    weights beside LoRA adapters. Pass a batch already on the mesh (`samples.shard_batch`) so the
    epochs do not transfer it again.

    A batch of a new shape makes two programs, the log-prob pass and the train step (tens of seconds
    of XLA's compiling at a real size). With `ahead` (a `CompileAhead` with threads) the train step
    compiles on a background thread while this one makes and runs the log-prob pass.
    """

    def __init__(self, cfg: ModelConfig, tc: TrainConfig, mesh=None, ahead: CompileAhead | None = None):
        self.cfg, self.tc = cfg, tc
        self.train_step = make_train_step(cfg, tc, mesh)
        self.compute_logprobs = make_compute_logprobs(cfg, tc, mesh)
        self.ahead = ahead or CompileAhead(0)

    def __call__(self, state: TrainState, batch: Batch, ref_params=None, frozen=None):
        if bool(self.cfg.lora_rank) != (frozen is not None):
            raise ValueError("LoRA training needs the frozen weights (frozen=...), and only LoRA takes them")
        if self.tc.kl_coef and ref_params is None:
            raise ValueError("kl_coef > 0 needs the frozen reference's parameters (ref_params)")
        weights = () if frozen is None else (frozen,)
        program = ("train step", id(self), tuple(x.shape for x in batch))
        if self.tc.kl_coef or not self.tc.on_policy:  # the passes' log-probs keep the batch's types
            self.ahead.submit(program, functools.partial(self.train_step.lower, state, batch, *weights))
        batch = self.logprob_passes(state, batch, ref_params, weights)
        self.ahead.wait(program)
        return self.epochs(state, batch, weights)

    def logprob_passes(self, state: TrainState, batch: Batch, ref_params, weights: tuple) -> Batch:
        """The batch with the reference's log-probs (kl_coef > 0) and PPO's old ones (epochs > 1)."""
        if self.tc.kl_coef:
            batch = batch._replace(ref_logprobs=self.compute_logprobs(ref_params, batch, *weights))
        if not self.tc.on_policy:
            batch = batch._replace(old_logprobs=self.compute_logprobs(state.params, batch, *weights))
        return batch

    def epochs(self, state: TrainState, batch: Batch, weights: tuple):
        """`epochs` train steps on the batch: (state, [metrics per epoch])."""
        metrics = []
        for _ in range(self.tc.epochs):
            state, m = self.train_step(state, batch, *weights)
            metrics.append(m)
        return state, metrics


def make_update(cfg: ModelConfig, tc: TrainConfig, mesh=None, ahead: CompileAhead | None = None) -> Update:
    """The learner's iteration on a packed batch: see `Update`."""
    return Update(cfg, tc, mesh, ahead)
