"""Turning next-token logits into a sampling distribution, a token, and its log-probs.

Sampling draws one uniform number per row and inverts the CDF, instead of drawing a Gumbel number per
vocabulary entry (millions of random numbers per step for a 150k vocabulary). The CDF is never built
in full: XLA's cumsum over a long axis is slow on CPU (6 ms for 32 x 32000, more than a decode step of
a small model), so the inversion goes in two levels, first over blocks of the vocabulary, then inside
the chosen block, both as small matmuls with a triangular matrix. Nor is the distribution itself
materialised: the block masses are one fused exp-and-sum pass over the logits, and only the chosen
block's probabilities are computed again.

Everything here works vocabulary-major, on [V, B]. On CPU the unembedding produces the logits in
that order (the vocabulary leads the product, see `models.transformer.dense`), so the transpose at the
top of `sample_token` cancels, and every pass over the vocabulary reads memory in order: reducing a
[B, V] view of that memory over V instead costs 2.5x more in XLA:CPU, and transposing it first costs
a copy. On accelerators the transpose is a layout choice.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


_BLOCK = 128


def _blocks(x: jax.Array, fill: float) -> jax.Array:
    """[V, B] -> [V/block, block, B], padding V with `fill`."""
    v, b = x.shape
    pad = -v % _BLOCK
    return jnp.pad(x, ((0, pad), (0, 0)), constant_values=fill).reshape((v + pad) // _BLOCK, _BLOCK, b)


def _inclusive_cumsum(x: jax.Array) -> jax.Array:
    """Cumulative sum over the second-to-last (short) axis, as a matmul with a lower-triangular matrix."""
    n = x.shape[-2]
    return jnp.einsum("ij,...jb->...ib", jnp.tril(jnp.ones((n, n), x.dtype)), x, precision=jax.lax.Precision.HIGHEST)


def cumsum(x: jax.Array) -> jax.Array:
    """Cumulative sum over the vocabulary of [V, B], blockwise (see the module docstring)."""
    blocks = _blocks(x, 0.0)
    mass = blocks.sum(1)
    before = _inclusive_cumsum(mass) - mass  # mass of the earlier blocks, [V/block, B]
    out = _inclusive_cumsum(blocks) + before[:, None]
    return out.reshape(-1, x.shape[1])[:x.shape[0]]


def inverse_cdf(scaled: jax.Array, top: jax.Array, u: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draw from p ~ exp(scaled - top) over the vocabulary of [V, B] by inverting its CDF at u [B].

    Returns per row the first index whose cumulative mass reaches u * total, the total mass (summed
    exactly from the block masses, not read off the matmul cumsum, which runs at reduced precision on
    TPU; it saves the caller another pass over the vocabulary), and whether the drawn index has
    nonzero probability (fp rounding at a block boundary can land on a masked one).
    """
    blocks = _blocks(scaled, -jnp.inf)  # [nb, block, B]
    block_mass = jnp.exp(blocks - top).sum(1)  # [nb, B]
    cum_blocks = _inclusive_cumsum(block_mass)
    target = u * cum_blocks[-1]
    block = jnp.minimum(jnp.sum(cum_blocks < target, axis=0), blocks.shape[0] - 1)  # [B]
    before = jnp.where(block > 0, jnp.take_along_axis(cum_blocks, jnp.maximum(block - 1, 0)[None], 0)[0], 0.0)
    chosen = jnp.exp(jnp.take_along_axis(blocks, block[None, None], axis=0)[0] - top)  # [block, B]
    offset = jnp.minimum(jnp.sum(_inclusive_cumsum(chosen) < target - before, axis=0), _BLOCK - 1)
    token = jnp.minimum(block * _BLOCK + offset, scaled.shape[0] - 1)
    kept = jnp.take_along_axis(chosen, offset[None], axis=0)[0] > 0
    return token, cum_blocks[-1], kept


def argmax(x: jax.Array) -> jax.Array:
    """First index of the maximum over the vocabulary of [V, B], as jnp.argmax in two plain reductions
    (2.7x faster on CPU)."""
    top = jnp.max(x, axis=0, keepdims=True)
    return jnp.min(jnp.where(x == top, jnp.arange(x.shape[0])[:, None], x.shape[0]), axis=0).astype(jnp.int32)


def truncate(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Mask (to -inf) everything outside the top-k, then outside the smallest top-p nucleus.

    scaled: tempered logits [V, B]. top_k <= 0 means no top-k. Tokens tied with the last kept
    value are kept too.
    """
    vocab = scaled.shape[0]
    ranks = jnp.arange(vocab)[:, None]
    sorted_desc = -jnp.sort(-scaled, axis=0)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    in_top_k = ranks < k
    probs = jax.nn.softmax(jnp.where(in_top_k, sorted_desc, -jnp.inf), axis=0)
    mass_before = cumsum(probs) - probs
    keep = in_top_k & (mass_before < top_p)  # the first token is always kept
    n_keep = jnp.sum(keep, axis=0, keepdims=True)
    threshold = jnp.take_along_axis(sorted_desc, n_keep - 1, axis=0)
    return jnp.where(scaled >= threshold, scaled, -jnp.inf)


def sample_token(logits, keys, temperature, top_k, top_p, *, greedy: bool, truncated: bool,
                 plain: bool = False):
    """Pick one token per row of logits [B, V]. Returns (token [B], behaviour log-prob [B], raw log-prob [B]).

    The behaviour log-prob is under the distribution actually sampled from (tempered, truncated);
    the raw log-prob is under temperature 1 and the full vocabulary. Greedy decoding reports the raw
    log-prob for both. plain=True promises temperature 1 and no truncation (the caller checks).
    """
    logits = logits.T  # vocabulary-major: see the module docstring
    pick = lambda x: jnp.take_along_axis(x, token[None], axis=0)[0]  # noqa: E731
    if greedy:
        token = argmax(logits)
        lp = pick(logits) - jax.nn.logsumexp(logits, axis=0)
        return token, lp, lp
    scaled = logits if plain else logits / temperature
    if truncated:
        scaled = truncate(scaled, top_k, top_p)
    top = jnp.max(scaled, axis=0)
    u = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(keys)
    token, mass, kept = inverse_cdf(scaled, top, u)
    logz = top + jnp.log(mass)
    # A draw of a zero-probability token is rare, so the extra pass over the vocabulary to step back to
    # the most likely one runs only in a step where it happens.
    token = jax.lax.cond(jnp.all(kept), lambda: token, lambda: jnp.where(kept, token, argmax(scaled)))
    # At temperature 1 without truncation the sampled distribution is the raw one: skip a second pass
    # of exp over the vocabulary.
    raw_logz = logz if plain else jax.nn.logsumexp(logits, axis=0)
    return token, pick(scaled) - logz, pick(logits) - raw_logz
