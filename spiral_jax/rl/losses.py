"""Token log-probs in sequence chunks, and the policy-gradient / PPO-clip loss.

Full [B, T, V] logits never exist: the decoder runs over the whole sequence, then a scan over
chunks of the response slots unembeds [B, C, V] at a time (prompt slots are never unembedded). The
chunk function is rematerialised, so the backward pass recomputes each chunk's logits instead of
storing them.

The loss is written per token and reduced with per-token weights computed once over the whole batch
(`token_weights`). That makes the loss a plain sum, so micro-batches add up to exactly the full-batch
loss and padding (weight 0) never changes it.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from spiral_jax.models import ModelConfig, decoder, unembed
from spiral_jax.rl.samples import Batch
from spiral_jax.sharding import Rules, constrain

NORMALISERS = ("constant", "token_mean")
DRIFT_RANGE = (0.9, 1.1)  # learner/sampler probability ratios outside this count as drifted


def response_chunk(chunk: int, slots: int) -> int:
    """The response slots unembedded at a time: at most `chunk`, and a divisor of the row's `slots`
    (a power of two, or a packed row's quarter-octave length: 1280 go 256 at a time under 512)."""
    return math.gcd(min(chunk, slots), slots)


def token_logprobs(params, cfg: ModelConfig, batch: Batch, chunk: int, rules: Rules | None = None):
    """(log p(targets), entropy) per slot, both fp32 [B, T] and 0 off the response; entropy carries
    no gradient. Logits are formed only at `batch.response_slots`, `chunk` slots at a time."""
    hidden, _ = decoder(params, cfg, batch.tokens, batch.positions, batch.segment_ids, rules=rules,
                        segments=batch.segments)
    b, t, d = hidden.shape
    slots = batch.response_slots
    r = slots.shape[1]
    chunk = response_chunk(chunk, r)
    real = jnp.take_along_axis(batch.loss_mask, slots, axis=1) > 0
    hidden = jnp.take_along_axis(hidden, slots[..., None], axis=1)  # [B, R, D]
    hidden = hidden.reshape(b, r // chunk, chunk, d).swapaxes(0, 1)  # [n, B, C, D]
    targets = jnp.take_along_axis(batch.targets, slots, axis=1)
    targets = targets.reshape(b, r // chunk, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(params, h, y):
        logits = constrain(unembed(params, cfg, h, local=rules is None), rules, ("batch", "seq", "vocab"))
        logz = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0] - logz
        entropy = logz - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
        return logp, jax.lax.stop_gradient(entropy)

    _, (logp, entropy) = jax.lax.scan(lambda c, xs: (c, one_chunk(params, *xs)), None,
                                      (hidden, targets))
    # Back to the slot layout; real response slots are distinct, padding entries add 0.
    to_slots = jax.vmap(lambda s, v: jnp.zeros((t,), jnp.float32).at[s].add(v))
    unsplit = lambda x: to_slots(slots, jnp.where(real, x.swapaxes(0, 1).reshape(b, r), 0.0))  # noqa: E731
    return unsplit(logp), unsplit(entropy)


def sample_mask(batch: Batch) -> jax.Array:
    """[B, S]: which of `batch.advantages`' entries are samples (a row's segments 1 .. its last)."""
    return jnp.arange(batch.segments)[None, :] < jnp.max(batch.segment_ids, axis=1)[:, None]


def slot_advantages(batch: Batch) -> jax.Array:
    """[B, T]: each slot's sample's advantage (padding slots read the row's first; their loss is 0)."""
    return jnp.take_along_axis(batch.advantages, jnp.maximum(batch.segment_ids - 1, 0), axis=1)


def token_weights(batch: Batch, normaliser: str, constant: float = 4096.0) -> jax.Array:
    """Per-token weights [B, T] that turn a sum of token losses into the configured mean.

    "constant": each sample's token losses summed and divided by `constant` (the reference uses the
    generation limit, 4096), then averaged over the samples. "token_mean": the mean over all
    response tokens of the batch.
    """
    mask = batch.loss_mask
    if normaliser == "constant":
        return mask / (constant * jnp.maximum(jnp.sum(sample_mask(batch)), 1))
    if normaliser == "token_mean":
        return mask / jnp.maximum(jnp.sum(mask), 1.0)
    raise ValueError(f"unknown normaliser {normaliser!r}; use one of {NORMALISERS}")


def tis_weight(learner_logp, sampler_logp, cap: float):
    """Truncated importance weight min(p_learner / p_sampler, cap) against the sampler's log-probs."""
    return jnp.minimum(jnp.exp(learner_logp - sampler_logp), cap)


def kl_to_reference(logp, ref_logp):
    """Per-token KL(policy || reference), the non-negative k3 estimator on the sampled tokens."""
    delta = ref_logp - logp
    return jnp.exp(delta) - delta - 1.0


def behaviour_logprobs(logp, batch: Batch, on_policy: bool):
    """The learner-side log-probs of the policy that produced the batch (PPO ratio, TIS weight).

    on_policy: the current ones, stop-gradiented. Otherwise `batch.old_logprobs`, recomputed by the
    learner before PPO's first epoch (so that epoch's ratio is 1 and its gradient REINFORCE's).
    """
    return jax.lax.stop_gradient(logp) if on_policy else batch.old_logprobs


def token_loss(logp, batch: Batch, *, on_policy: bool, clip: float | None, tis_cap: float | None,
               kl_coef: float):
    """Per-token loss [B, T] (unweighted, 0 off the response) and where the PPO clip is active.

    on_policy: REINFORCE, -A log p. Otherwise PPO's -min(r A, clip(r) A), r = p / p_old. Optional
    factors: the truncated importance weight against the sampler, and a KL penalty to a reference.

    Off the response logp is replaced by 0 (as the batch's other log-prob fields are, by
    construction): padding slots hold arbitrary log-probs whose exp() may overflow, and a masked-out
    inf would still turn the gradient into NaN.
    """
    logp = jnp.where(batch.loss_mask > 0, logp, 0.0)
    old = behaviour_logprobs(logp, batch, on_policy)
    adv = slot_advantages(batch)
    clipped = jnp.zeros(logp.shape, bool)
    if on_policy:  # REINFORCE: the value is the log-likelihood objective, the gradient A grad log p
        surrogate = adv * logp
    else:
        ratio = jnp.exp(logp - old)
        surrogate = ratio * adv
        if clip is not None:
            bounded = jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * adv
            clipped = bounded < surrogate  # the min below picks the clipped term: no gradient there
            surrogate = jnp.minimum(surrogate, bounded)
    loss = -surrogate
    if tis_cap is not None:
        loss = loss * jax.lax.stop_gradient(tis_weight(old, batch.sampler_logprobs, tis_cap))
    if kl_coef:
        loss = loss + kl_coef * kl_to_reference(logp, batch.ref_logprobs)
    return loss, clipped


def loss_metrics(logp, entropy, clipped, batch: Batch, *, on_policy: bool, tis_cap: float | None,
                 kl_coef: float):
    """Token-mean statistics over the response tokens (and sample statistics over the samples)."""
    mask = batch.loss_mask
    n_tokens = jnp.maximum(jnp.sum(mask), 1.0)
    mean = lambda x: jnp.sum(jnp.where(mask > 0, x, 0.0)) / n_tokens  # noqa: E731
    samples = sample_mask(batch)
    adv = batch.advantages
    drift = jnp.where(mask > 0, logp - batch.sampler_logprobs, 0.0)
    ratio = jnp.exp(drift)
    metrics = {
        "entropy": mean(entropy),
        "clip_fraction": mean(clipped),
        "advantage_mean": jnp.sum(jnp.where(samples, adv, 0.0)) / jnp.maximum(jnp.sum(samples), 1),
        "advantage_min": jnp.min(jnp.where(samples, adv, jnp.inf)),
        "advantage_max": jnp.max(jnp.where(samples, adv, -jnp.inf)),
        "drift_mean": mean(jnp.abs(drift)),
        "drift_max": jnp.max(jnp.abs(drift)),
        "drift_outside": mean((ratio < DRIFT_RANGE[0]) | (ratio > DRIFT_RANGE[1])),
        "response_tokens": jnp.sum(mask),
        "samples": jnp.sum(samples).astype(jnp.float32),
        "nonfinite_logprobs": jnp.sum(~jnp.isfinite(jnp.where(mask > 0, logp, 0.0))).astype(jnp.float32),
    }
    if tis_cap is not None:
        old = behaviour_logprobs(logp, batch, on_policy)
        metrics["tis_weight"] = mean(tis_weight(old, batch.sampler_logprobs, tis_cap))
    if kl_coef:
        metrics["kl"] = mean(kl_to_reference(logp, batch.ref_logprobs))
    return metrics
