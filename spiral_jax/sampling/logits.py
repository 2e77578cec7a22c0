"""Turning next-token logits into a sampling distribution, a token, and its log-probs.

Sampling draws one uniform number per row and inverts the CDF, instead of drawing a Gumbel number per
vocabulary entry (millions of random numbers per step for a 150k vocabulary). The CDF is never built
in full: XLA's cumsum over a long axis is slow on CPU (longer than a small model's whole decode
step), so the inversion goes in two levels, first over blocks of the vocabulary, then inside
the chosen block, both as small matmuls with a triangular matrix. Vocabulary-major (below), the
distribution itself is not stored either: the block masses are one fused exp-and-sum pass over the
logits, and only the chosen block's probabilities are computed again.

Top-k and top-p find their cut without sorting the vocabulary: among each row's largest values, or
by halving the range of values (`truncate`).

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
CANDIDATES = 256  # how many of a row's largest values truncation looks among first


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
    shape: the first index whose cumulative mass reaches u * total (above 0), the total mass, and whether the
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
    # A draw of u = 0 must still pass over the leading zero-mass tokens: aim at the least positive mass.
    target = jnp.maximum(u * total, jnp.finfo(total.dtype).tiny)
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


def _smallest_kept(best: jax.Array, k: jax.Array, top_p: jax.Array, total: jax.Array):
    """Top-k then top-p on a row's n largest values best [B, n] in descending order, with `total` the
    mass of the row's whole vocabulary relative to its largest value: the smallest value kept, and how
    many of the n are kept. They decide the cut only where fewer than n are kept, or k <= n.
    top_p >= 1 keeps all of the top-k."""
    n = best.shape[1]
    in_top_k = jnp.arange(n) < k
    rel = jnp.exp(jnp.where(in_top_k, best, -jnp.inf) - best[:, :1])
    probs = rel / jnp.where(k <= n, rel.sum(1, keepdims=True), total)
    mass_before = cumsum(probs, 1) - probs
    keep = in_top_k & ((mass_before < top_p) | (top_p >= 1))  # the first token is always kept
    n_keep = jnp.sum(keep, axis=1, keepdims=True)
    return jnp.take_along_axis(best, n_keep - 1, axis=1), n_keep


def _keys(x: jax.Array) -> jax.Array:
    """Each float's bits as an unsigned integer that orders as the float does (-0 just below +0: both
    have the same probability, and the mask compares floats, so a cut at either keeps both)."""
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    return bits ^ jnp.where(bits >> 31 == 1, jnp.uint32(0xFFFFFFFF), jnp.uint32(0x80000000))


def _float(key: jax.Array) -> jax.Array:
    """The float whose `_keys` is key."""
    bits = key ^ jnp.where(key >> 31 == 1, jnp.uint32(0x80000000), jnp.uint32(0xFFFFFFFF))
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def _least_key(holds, shape: tuple[int, ...]) -> jax.Array:
    """The least key where holds(key) is true, per row, for a predicate that holds at every key above
    one where it holds: 32 halvings of the key space, each one evaluation. A loop on CPU and TPU, which
    compiles one halving instead of 32 and runs as fast; unrolled on GPUs, where XLA reads a loop's
    condition back to the host every iteration."""
    def halve(i, key):  # fixes the key's bit 31 - i
        bit = jnp.uint32(1 << 31) >> jnp.asarray(i, jnp.uint32)
        below = key | (bit - 1)  # the largest key under the bits fixed so far, this one 0
        return jnp.where(holds(below), key, key | bit)

    key = jnp.zeros(shape, jnp.uint32)
    if cpu.platform() != "gpu":
        return jax.lax.fori_loop(0, 32, halve, key)
    for i in range(32):
        key = halve(i, key)
    return key


def _cut_by_halving(rows: jax.Array, k: jax.Array, top_p: jax.Array, settled: jax.Array) -> jax.Array:
    """The smallest kept value of each row of `rows` [B, V], found without sorting: a value is kept
    when fewer than k values and less than top_p of the top-k mass lie strictly above it, so the cut
    is the least value where both hold, searched for by halving the 32-bit key space (32 passes over
    the row for top-p, 32 more for a top-k below the vocabulary). Values tied with the cut stay.
    The top-k search is skipped where every row is `settled` or has no top-k (always run on GPUs, where
    a conditional syncs with the host)."""
    top = jnp.max(rows, axis=1, keepdims=True)
    keys, rel = _keys(rows), jnp.exp(rows - top)
    top_key = _keys(top)  # the largest value is always kept

    def count_above(key):
        return jnp.sum(keys > key, axis=1, keepdims=True)

    def mass_above(key):
        return jnp.sum(jnp.where(keys > key, rel, 0.0), axis=1, keepdims=True)

    def kth():  # the k-th largest value, and the mass of the k largest (as many of its ties as fill k)
        key = _least_key(lambda key: (count_above(key) < k) | (key >= top_key), top.shape)
        return key, mass_above(key) + (k - count_above(key)) * jnp.exp(_float(key) - top)

    if cpu.platform() == "gpu":
        k_key, k_mass = kth()
    else:
        everything = lambda: (jnp.zeros(top.shape, jnp.uint32), rel.sum(1, keepdims=True))  # noqa: E731
        k_key, k_mass = jax.lax.cond(jnp.all(settled | (k >= rows.shape[1])), everything, kth)
    p_key = _least_key(lambda key: (mass_above(key) < top_p * k_mass) | (top_p >= 1) | (key >= top_key), top.shape)
    return _float(jnp.maximum(k_key, p_key))


def _cut(rows: jax.Array, k: jax.Array, top_p: jax.Array, settled: jax.Array, candidates: int) -> jax.Array:
    """The smallest kept value of each row of `rows` [B, V] (none of `settled`'s is looked for), looked
    for among its `candidates` largest values, then by halving for the rows those leave undecided."""
    vocab = rows.shape[1]
    if not 0 < candidates < vocab:
        return _cut_by_halving(rows, k, top_p, settled)
    # XLA:CPU runs top_k as a partial sort only while nothing but slices reads the sort it lowers to;
    # the barrier keeps the gather below from being folded into it, which would make it a full sort.
    best = jax.lax.optimization_barrier(jax.lax.top_k(rows, candidates)[0])
    total = jnp.exp(rows - best[:, :1]).sum(1, keepdims=True)
    threshold, n_keep = _smallest_kept(best, k, top_p, total)
    decided = settled | (k <= candidates) | ((k == vocab) & (n_keep < candidates))
    return jax.lax.cond(jnp.all(decided), lambda: threshold, lambda: jnp.where(
        decided, threshold, _cut_by_halving(rows, k, top_p, decided)))


def truncate(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array, ax: int,
             candidates: int | None = None) -> jax.Array:
    """Mask (to -inf) everything outside the top-k, then outside the smallest top-p nucleus.

    scaled: tempered logits with the vocabulary along ax. top_k <= 0 means no top-k; top_p >= 1 no
    top-p. Tokens tied with the last kept value are kept too.

    Nothing sorts the vocabulary: a sort of 150k values every decode step costs XLA:CPU tens of times
    the rest of the sampling. The cut is found by halving the range of values (`_cut_by_halving`), a
    fixed number of passes over each row. On CPU and TPU it is first looked for among each row's
    `candidates` largest values (`lax.top_k`), which decide it for a nucleus narrower than those, as a
    trained model's mostly is; the halving then runs under a conditional, only in a step where some
    row needs it. XLA:GPU runs a conditional from the host (see `sample_token`), so there every step
    halves. candidates (static): how many, 0 to halve every step; None picks by platform.
    """
    if candidates is None:
        candidates = 0 if cpu.platform() == "gpu" else CANDIDATES
    vocab = scaled.shape[ax]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    whole = (k == vocab) & (top_p >= 1)  # nothing to cut
    # Per row [B, 1], over row-major logits, which is what lax.top_k takes.
    rows = scaled if ax == 1 else scaled.T
    k_rows, p_rows, whole_rows = (x if jnp.ndim(x) == 0 else x.reshape(-1, 1) for x in (k, top_p, whole))
    threshold = _cut(rows, k_rows, p_rows, whole_rows, candidates)
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
