"""Top-k/top-p sampling at a real vocabulary, three ways: the cut found among each row's largest values
(`lax.top_k`) and by halving past those (the default off GPUs), by halving alone (the GPUs'), and by
sorting the vocabulary every step (the way before either, for comparison).

One decode step's sampling, `sample_token(mode="truncated")`, at Qwen3's vocabulary of 151,936 (or
--vocab), on this machine's default device, for four kinds of rows:
- peaked: a Zipf law (p ~ 1/rank^1.2, shuffled) at temperature 0.7, as a trained model's next-token
  distribution; its nucleus fits among the candidates;
- flat: normal logits with standard deviation 3, a nucleus of about a thousand tokens, past the
  candidates;
- mixed: peaked rows and one flat row, which takes the whole batch past the candidates;
- wide: normal logits with standard deviation 1, a nucleus of more than half the vocabulary.

The "tempered" column samples at the same temperature without truncation, the cost of the rest.

    python bench/truncation.py [--rows 1 8 32] [--top_p 0.95] [--top_k 0] [--vocab 151936]
"""
from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.sampling import logits as logits_module

TEMPERATURE = 0.7


def peaked(rows: int, vocab: int) -> jax.Array:
    rank = np.arange(1, vocab + 1)
    rng = np.random.default_rng(0)
    return jnp.asarray(np.stack([rng.permutation(-1.2 * np.log(rank)) for _ in range(rows)]), jnp.float32)


def flat(rows: int, vocab: int) -> jax.Array:
    return jax.random.normal(jax.random.key(0), (rows, vocab)) * 3


def mixed(rows: int, vocab: int) -> jax.Array:
    return peaked(rows, vocab).at[-1].set(flat(1, vocab)[0])


def wide(rows: int, vocab: int) -> jax.Array:
    return jax.random.normal(jax.random.key(0), (rows, vocab))


def seconds(fn, *args, repeats: int = 5) -> float:
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / repeats


def truncate_by_sorting(scaled, top_k, top_p, ax):
    """`logits.truncate`'s cut, found by sorting each row's whole vocabulary."""
    rows = scaled if ax == 1 else scaled.T
    vocab = rows.shape[1]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab).reshape(-1, 1)
    top_p = jnp.reshape(top_p, (-1, 1))
    desc = -jnp.sort(-rows, axis=1)
    total = jnp.exp(rows - desc[:, :1]).sum(1, keepdims=True)
    threshold = logits_module._smallest_kept(desc, k, top_p, total)[0]
    threshold = threshold if ax == 1 else threshold.T
    return jnp.where(((k == vocab) & (top_p >= 1)) | (scaled >= threshold), scaled, -jnp.inf)


def sampler(mode: str, top_k: int, top_p: float, truncate=None):
    """A jitted decode step's sampling, with `truncate` in place of `logits.truncate` if given."""
    real = logits_module.truncate

    def step(x, keys):
        logits_module.truncate = truncate or real  # read when the step is traced, inside this call
        try:
            return logits_module.sample_token(x, keys, jnp.float32(TEMPERATURE), jnp.int32(top_k),
                                              jnp.float32(top_p), mode=mode)[0]
        finally:
            logits_module.truncate = real
    return jax.jit(step)


def nucleus(x: jax.Array, top_k: int, top_p: float) -> int:
    """Tokens kept in the widest row."""
    cut = truncate_by_sorting(x / TEMPERATURE, jnp.int32(top_k), jnp.float32(top_p), 1)
    return int(jnp.isfinite(cut).sum(1).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32], help="batch sizes")
    parser.add_argument("--top_p", type=float, default=0.95)
    parser.add_argument("--top_k", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=151_936, help="vocabulary size (Qwen3's by default)")
    args = parser.parse_args()
    device = jax.devices()[0]
    print(f"sampling one token per row, vocabulary {args.vocab:,}, temperature {TEMPERATURE}, top-k {args.top_k}, "
          f"top-p {args.top_p}, {logits_module.CANDIDATES} candidates, {device.platform} ({device.device_kind})")
    print(f"{'rows':>5s} {'logits':>7s} {'widest':>8s} {'tempered ms':>12s} {'candidates ms':>14s} "
          f"{'halving ms':>11s} {'sort ms':>9s} {'sort / candidates':>18s} {'sort / halving':>15s}")
    tempered = sampler("tempered", 0, 1.0)
    ways = [sampler("truncated", args.top_k, args.top_p, functools.partial(logits_module.truncate, candidates=n))
            for n in (logits_module.CANDIDATES, 0)]
    ways.append(sampler("truncated", args.top_k, args.top_p, truncate_by_sorting))
    for rows in args.rows:
        keys = jax.random.split(jax.random.key(1), rows)
        for name, make in (("peaked", peaked), ("flat", flat), ("mixed", mixed), ("wide", wide)):
            x = make(rows, args.vocab)
            t, c, h, s = (seconds(f, x, keys) * 1e3 for f in [tempered, *ways])
            print(f"{rows:5d} {name:>7s} {nucleus(x, args.top_k, args.top_p):8,d} {t:12.2f} {c:14.2f} {h:11.2f} "
                  f"{s:9.2f} {s / c:17.1f}x {s / h:14.1f}x")


if __name__ == "__main__":
    main()
