"""Turning next-token logits into a sampling distribution, a token, and its log-probs.

Sampling draws one uniform number per row and inverts the CDF, instead of drawing a Gumbel number per
vocabulary entry: for a 150k vocabulary that is the difference between a memory-bound cumsum and
millions of random numbers per step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def truncate(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Mask (to -inf) everything outside the top-k, then outside the smallest top-p nucleus.

    scaled: tempered logits [B, V]. top_k <= 0 means no top-k. Tokens tied with the last kept
    value are kept too.
    """
    vocab = scaled.shape[-1]
    ranks = jnp.arange(vocab)
    sorted_desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    in_top_k = ranks < k
    probs = jax.nn.softmax(jnp.where(in_top_k, sorted_desc, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep = in_top_k & (mass_before < top_p)  # the first token is always kept
    n_keep = jnp.sum(keep, axis=-1, keepdims=True)
    threshold = jnp.take_along_axis(sorted_desc, n_keep - 1, axis=-1)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample_token(logits, keys, temperature, top_k, top_p, *, greedy: bool, truncated: bool):
    """Pick one token per row. Returns (token [B], behaviour log-prob [B], raw log-prob [B]).

    The behaviour log-prob is under the distribution actually sampled from (tempered, truncated);
    the raw log-prob is under temperature 1 and the full vocabulary. Greedy decoding reports the raw
    log-prob for both.
    """
    raw = jax.nn.log_softmax(logits, axis=-1)
    if greedy:
        token = jnp.argmax(logits, axis=-1)
        lp = jnp.take_along_axis(raw, token[:, None], axis=-1)[:, 0]
        return token.astype(jnp.int32), lp, lp
    scaled = logits / temperature
    if truncated:
        scaled = truncate(scaled, top_k, top_p)
    behaviour = jax.nn.log_softmax(scaled, axis=-1)
    cdf = jnp.cumsum(jnp.exp(behaviour), axis=-1)
    u = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(keys)
    token = jnp.sum(cdf < (u * cdf[:, -1])[:, None], axis=-1)
    token = jnp.minimum(token, logits.shape[-1] - 1)
    # fp rounding can land on a masked token next to the boundary; step back to a kept one
    token = jnp.where(jnp.take_along_axis(behaviour, token[:, None], -1)[:, 0] == -jnp.inf,
                      jnp.argmax(behaviour, axis=-1), token).astype(jnp.int32)
    pick = lambda lp: jnp.take_along_axis(lp, token[:, None], axis=-1)[:, 0]  # noqa: E731
    return token, pick(behaviour), pick(raw)
