"""Turning next-token logits into a sampling distribution, a token, and its log-probs.

Sampling draws one uniform number per row and inverts the CDF, instead of drawing a Gumbel number per
vocabulary entry (millions of random numbers per step for a 150k vocabulary). The CDF is never built
in full: XLA's cumsum over a long axis is slow on CPU (longer than a small model's whole decode
step), so the inversion goes in two levels, first over blocks of the vocabulary, then inside
the chosen block, both as small matmuls with a triangular matrix. Vocabulary-major (below), the
distribution itself is not stored either: the block masses are one fused exp-and-sum pass over the
logits, and only the chosen block's probabilities are computed again.

Top-k and top-p look for their cut among each row's largest values instead of sorting the whole
vocabulary every step (`truncate`).

The helpers take the vocabulary axis `ax` of a 2-D array, 1 for [B, V] or 0 for [V, B], and keep
per-row results with that axis kept at size 1, so they broadcast against the logits either way. On
CPU, batches of 16 rows or more are sampled vocabulary-major: the unembedding produces the logits
in that order (the vocabulary leads the product, see `models.cpu.dense`), so the transpose
cancels and every pass reads memory in order; reducing the [B, V] view of that memory costs XLA:CPU
several times more. Few rows are sampled row-major, where XLA:CPU's reductions over a leading axis
with a narrow trailing one are slow. What each choice is worth: docs/performance.md.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from spiral_jax.models import cpu


_BLOCK = 128
MODES = ("greedy", "plain", "tempered", "truncated")
_VOCAB_MAJOR_ROWS = 16  # on CPU, batches of at least this many rows are sampled vocabulary-major
CANDIDATES = (256, 4096)  # how many of a row's largest values truncation looks among, in turn


def _blocks(x: jax.Array, ax: int, fill: float) -> jax.Array:
    """Split the vocabulary axis of x into (V/block, block) axes at ax, ax + 1, padding with `fill`."""
    v = x.shape[ax]
    pad = -v % _BLOCK
    widths = [(0, 0), (0, 0)]
    widths[ax] = (0, pad)
    x = jnp.pad(x, widths, constant_values=fill)
    return x.reshape(x.shape[:ax] + ((v + pad) // _BLOCK, _BLOCK) + x.shape[ax + 1:])


def _inclusive_cumsum(x: jax.Array, axis: int) -> jax.Array:
    """Cumulative sum along a short axis, as a matmul with a triangular matrix (at full precision:
    TPUs otherwise multiply f32 in bf16 passes; only the search reads it)."""
    n = x.shape[axis]
    letters = "abcd"[:x.ndim]
    out = letters.replace(letters[axis], "z")
    lower = jnp.tril(jnp.ones((n, n), x.dtype))  # lower[z, j] = 1 where j <= z
    return jnp.einsum(f"z{letters[axis]},{letters}->{out}", lower, x, precision=jax.lax.Precision.HIGHEST)


def cumsum(x: jax.Array, ax: int) -> jax.Array:
    """Cumulative sum over the vocabulary axis, blockwise (see the module docstring)."""
    blocks = _blocks(x, ax, 0.0)
    mass = blocks.sum(ax + 1)
    before = _inclusive_cumsum(mass, ax) - mass  # mass of the earlier blocks
    out = _inclusive_cumsum(blocks, ax + 1) + jnp.expand_dims(before, ax + 1)
    out = out.reshape(x.shape[:ax] + (-1,) + x.shape[ax + 1:])
    return jax.lax.slice_in_dim(out, 0, x.shape[ax], axis=ax)


def inverse_cdf(scaled: jax.Array, top: jax.Array, u: jax.Array, ax: int):
    """Draw from p ~ exp(scaled - top) over the vocabulary axis by inverting its CDF at u.

    top and u hold one value per row (the vocabulary axis kept at size 1). Returns per row, in the same
    shape: the first index whose cumulative mass reaches u * total, the total mass, and whether the
    drawn index has nonzero probability (fp rounding at a block boundary can land on a masked one).
    """
    blocks = _blocks(scaled, ax, -jnp.inf)
    nb = blocks.shape[ax]
    if ax == 0:
        # The exponentials are fused into the block sums and never stored. The barrier keeps XLA from
        # rewriting the total's sum of sums as a second pass over them, which would store them.
        block_mass = jax.lax.optimization_barrier(jnp.exp(blocks - jnp.expand_dims(top, ax + 1)).sum(ax + 1))
    else:
        # Row-major, XLA:CPU fuses that form into the cumsum's matmul and runs it several times slower;
        # stored probabilities keep them apart.
        block_mass = _blocks(jnp.exp(scaled - top), ax, 0.0).sum(ax + 1)
    cum_blocks = _inclusive_cumsum(block_mass, ax)
    # The total is summed exactly, not read off the matmul: a library matmul's summation order may
    # depend on threads and blocking, and the total enters every log-prob.
    total = block_mass.sum(ax, keepdims=True)
    target = u * total
    block = jnp.minimum(jnp.sum(cum_blocks < target, axis=ax, keepdims=True), nb - 1)
    before = jnp.where(block > 0, jnp.take_along_axis(cum_blocks, jnp.maximum(block - 1, 0), axis=ax), 0.0)
    chosen = jnp.take_along_axis(blocks, jnp.expand_dims(block, ax + 1), axis=ax).squeeze(ax)
    chosen = jnp.exp(chosen - top)  # the chosen block's unnormalised probabilities, block along ax
    offset = jnp.minimum(jnp.sum(_inclusive_cumsum(chosen, ax) < target - before, axis=ax, keepdims=True),
                         _BLOCK - 1)
    token = jnp.minimum(block * _BLOCK + offset, scaled.shape[ax] - 1)
    return token, total, jnp.take_along_axis(chosen, offset, axis=ax) > 0


def argmax(x: jax.Array, ax: int) -> jax.Array:
    """First index of the maximum over the vocabulary axis (kept), as jnp.argmax in two plain
    reductions (faster on CPU than XLA's argmax)."""
    top = jnp.max(x, axis=ax, keepdims=True)
    index = jnp.expand_dims(jnp.arange(x.shape[ax]), 1 - ax)
    return jnp.min(jnp.where(x == top, index, x.shape[ax]), axis=ax, keepdims=True).astype(jnp.int32)


def _smallest_kept(sorted_desc: jax.Array, k: jax.Array, top_p: jax.Array, ax: int,
                   total: jax.Array | None = None):
    """Top-k then top-p on a row's largest values in descending order along ax: the smallest value
    kept, and how many of the given values are kept.

    sorted_desc holds the whole vocabulary, or only its first n values with `total` the mass of the
    row's whole vocabulary relative to its largest value (a prefix then decides the cut only where
    fewer than n are kept, or k <= n). top_p >= 1 keeps all of the top-k.
    """
    n = sorted_desc.shape[ax]
    in_top_k = jnp.expand_dims(jnp.arange(n), 1 - ax) < k
    rel = jnp.exp(jnp.where(in_top_k, sorted_desc, -jnp.inf) - jax.lax.slice_in_dim(sorted_desc, 0, 1, axis=ax))
    own = rel.sum(ax, keepdims=True)
    probs = rel / (own if total is None else jnp.where(k <= n, own, total))
    mass_before = cumsum(probs, ax) - probs
    keep = in_top_k & ((mass_before < top_p) | (top_p >= 1))  # the first token is always kept
    n_keep = jnp.sum(keep, axis=ax, keepdims=True)
    return jnp.take_along_axis(sorted_desc, n_keep - 1, axis=ax), n_keep


def _cut_among(rows: jax.Array, k: jax.Array, top_p: jax.Array, settled: jax.Array, sizes: tuple[int, ...],
               total: jax.Array | None = None) -> jax.Array:
    """The smallest kept value of each row of `rows` [B, V], looked for among its sizes[0] largest
    values; rows those leave undecided (unless `settled`) look among the next size's, then sort.
    total: each row's mass relative to its largest value, once the first size has found it."""
    vocab = rows.shape[1]
    if not sizes or sizes[0] >= vocab:
        return _smallest_kept(-jnp.sort(-rows, axis=1), k, top_p, 1)[0]
    n = sizes[0]
    # XLA:CPU runs top_k as a partial sort only while nothing but slices reads the sort it lowers to;
    # the barrier keeps the gather below from being folded into it, which would make it a full sort.
    best = jax.lax.optimization_barrier(jax.lax.top_k(rows, n)[0])
    if total is None:
        total = jnp.exp(rows - best[:, :1]).sum(1, keepdims=True)
    threshold, n_keep = _smallest_kept(best, k, top_p, 1, total)
    decided = settled | (k <= n) | ((k == vocab) & (n_keep < n))
    return jax.lax.cond(jnp.all(decided), lambda: threshold, lambda: jnp.where(
        decided, threshold, _cut_among(rows, k, top_p, decided, sizes[1:], total)))


def truncate(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, ax: int,
             candidates: tuple[int, ...] | None = None) -> jax.Array:
    """Mask (to -inf) everything outside the top-k, then outside the smallest top-p nucleus.

    scaled: tempered logits with the vocabulary along ax. top_k <= 0 means no top-k; top_p >= 1 no
    top-p. Tokens tied with the last kept value are kept too.

    A full sort of a 150k vocabulary every decode step costs XLA:CPU tens of times the rest of the
    sampling, so on CPU and TPU the cut is looked for among each row's largest values (`lax.top_k`),
    first the `candidates[0]` largest, then, under a conditional, for rows whose nucleus reaches past
    those, the next size's, and only past the last size does a sort run. XLA:GPU runs a conditional
    from the host (see `sample_token`), so there every step sorts. candidates (static): the sizes, ()
    to sort every step; None picks by platform.
    """
    if candidates is None:
        candidates = () if cpu.platform() == "gpu" else CANDIDATES
    vocab = scaled.shape[ax]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    whole = (k == vocab) & (top_p >= 1)  # nothing to cut
    # Per row [B, 1], over row-major logits, which is what lax.top_k and the sort take.
    rows = scaled if ax == 1 else scaled.T
    k_rows, p_rows, whole_rows = (x if jnp.ndim(x) == 0 else x.reshape(-1, 1) for x in (k, top_p, whole))
    threshold = _cut_among(rows, k_rows, p_rows, whole_rows, tuple(candidates))
    threshold = threshold if ax == 1 else threshold.T
    return jnp.where(whole | (scaled >= threshold), scaled, -jnp.inf)


def sample_token(logits, keys, temperature, top_k, top_p, *, mode: str, vocab_major: bool | None = None):
    """Pick one token per row of logits [B, V]. Returns (token [B], behaviour log-prob [B], raw log-prob [B]).

    temperature, top_k and top_p are scalars, or [B] arrays with one setting per row.

    mode (static, one of MODES; `SamplingParams.mode` picks it): "greedy" takes the argmax; "plain"
    samples the raw distribution and promises temperature 1 and no truncation (the caller checks), which
    saves a pass over the vocabulary; "tempered" divides by the temperature; "truncated" also applies
    top-k and top-p. The behaviour log-prob is under the distribution actually sampled from; the raw
    log-prob is under temperature 1 and the full vocabulary. Greedy decoding reports the raw log-prob
    for both. vocab_major (static): work on the transposed [V, B] logits, which XLA:CPU reduces faster
    at many rows; None decides by platform and batch size. Both layouts pick the same tokens.
    """
    if mode not in MODES:
        raise ValueError(f"sampling mode {mode!r}; use one of {', '.join(MODES)}")
    if vocab_major is None:
        vocab_major = cpu.layouts() and logits.shape[0] >= _VOCAB_MAJOR_ROWS
    ax = 0 if vocab_major else 1
    logits = logits.T if vocab_major else logits
    # Per-row settings [B] broadcast against the logits with the vocabulary axis kept at size 1.
    temperature, top_k, top_p = (x if jnp.ndim(x) == 0 else jnp.expand_dims(x, ax)
                                 for x in (temperature, top_k, top_p))
    pick = lambda x: jnp.take_along_axis(x, token, axis=ax).reshape(-1)  # noqa: E731
    if mode == "greedy":
        token = argmax(logits, ax)
        lp = pick(logits) - jax.nn.logsumexp(logits, axis=ax)
        return token.reshape(-1), lp, lp
    plain = mode == "plain"
    scaled = logits if plain else logits / temperature
    if mode == "truncated":
        scaled = truncate(scaled, top_k, top_p, ax)
    top = jnp.max(scaled, axis=ax, keepdims=True)
    u = jax.vmap(lambda k: jax.random.uniform(k, dtype=jnp.float32))(keys)
    token, mass, kept = inverse_cdf(scaled, top, jnp.expand_dims(u, ax), ax)
    logz = (top + jnp.log(mass)).reshape(-1)
    # A draw of a zero-probability token is rare, so on CPU and TPU the extra pass over the vocabulary
    # to step back to the most likely one runs only in a step where it happens. XLA:GPU runs a
    # conditional from the host: it reads the predicate back, a sync each decode step that splits the
    # step's CUDA graph in two and idles the GPU, which costs more than the pass. There it always runs.
    fallback = lambda: jnp.where(kept, token, argmax(scaled, ax))  # noqa: E731
    token = fallback() if cpu.platform() == "gpu" else jax.lax.cond(jnp.all(kept), lambda: token, fallback)
    # At temperature 1 without truncation the sampled distribution is the raw one: skip a second pass
    # of exp over the vocabulary.
    raw_logz = logz if plain else jax.nn.logsumexp(logits, axis=ax)
    return token.reshape(-1), pick(scaled) - logz, pick(logits) - raw_logz
