"""Exact log-probabilities of given continuations: scoring answers instead of sampling them.

Used where the question is "how likely is this answer" rather than "what does the model write":
exact Kuhn policy read-out, and the legal-set bootstrap's weights over the legal answers.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models import forward
from spiral_jax.sampling.sampler import bucket_length


def sequence_logprobs(params, cfg, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                      bucket: int = 64) -> np.ndarray:
    """log p(continuation | prompt) for each (prompt ids, continuation ids) pair, in one forward
    pass. Rows are left padded to a multiple of `bucket` and their count to a power of two, so
    repeated calls reuse a few compiled programs."""
    if empty := [i for i, (p, _) in enumerate(pairs) if not len(p)]:
        raise ValueError(f"pair {empty[0]} has an empty prompt: its first continuation token would have "
                         f"nothing to be predicted from (start the prompt with the chat template or a BOS token)")
    rows = [list(p) + list(c) for p, c in pairs]
    width = -(-max(len(r) for r in rows) // bucket) * bucket
    n = bucket_length(len(rows), 8)
    ids = np.zeros((n, width), np.int32)
    mask = np.zeros((n, width), bool)
    mask[len(rows):, -1] = True  # padding rows see one token, so their softmax stays finite
    targets = np.zeros((n, width - 1), np.int32)
    weights = np.zeros((n, width - 1), np.float32)
    for i, (r, (_, c)) in enumerate(zip(rows, pairs)):  # left padding, as the sampler does
        ids[i, width - len(r):], mask[i, width - len(r):] = r, True
        if c:  # token at position t is predicted at t - 1
            targets[i, width - 1 - len(c):] = c
            weights[i, width - 1 - len(c):] = 1.0
    return np.asarray(_scored(params, cfg, ids, mask, targets, weights))[:len(rows)]


@functools.partial(jax.jit, static_argnums=1)
def _scored(params, cfg, ids, mask, targets, weights):
    logp = jax.nn.log_softmax(forward(params, cfg, ids, mask)[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return (picked * weights).sum(-1)


def top_logprobs(params, cfg, prompt: Sequence[int], continuation: Sequence[int], k: int,
                 bucket: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely next tokens and their log-probs (temperature 1, whole vocabulary) at each
    token of `continuation` after `prompt`: ([len(continuation), k] ids, [len(continuation), k] log-probs)."""
    row = list(prompt) + list(continuation)
    width = -(-len(row) // bucket) * bucket
    ids = np.zeros((1, width), np.int32)
    mask = np.zeros((1, width), bool)
    ids[0, width - len(row):], mask[0, width - len(row):] = row, True
    values, tokens = jax.device_get(_top(params, cfg, ids, mask, k))
    # The token at position t is predicted at t - 1.
    picked = slice(width - 1 - len(continuation), width - 1)
    return tokens[0, picked], values[0, picked]


@functools.partial(jax.jit, static_argnums=(1, 4))
def _top(params, cfg, ids, mask, k):
    logp = jax.nn.log_softmax(forward(params, cfg, ids, mask).astype(jnp.float32), axis=-1)
    return jax.lax.top_k(logp, k)
