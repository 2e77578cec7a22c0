"""The decode engine's compiled programs (`engine.py` is the host side: which slot holds what).

`empty` makes a state of N slots over one KV cache; `insert` prefills new prompts' blocks in place
in their slots' rows and samples each first token; `decode` runs one-token steps for every live slot
until some rows finish. Their shapes are static: the engine buckets inserts by rows and block length,
and decode by attention window.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models import transformer
from spiral_jax.models.transformer import KVCache, decoder, unembed
from spiral_jax.sampling.finish import finished_sees_first, row_stops
from spiral_jax.sampling.logits import sample_token


class EngineState(NamedTuple):
    """Everything the compiled programs carry between calls, one row per slot."""

    cache: KVCache  # [layers, slots, kv_heads, cache_len, head_dim]
    length: jax.Array  # [slots] int32: cache slots holding this row's tokens = the next token's slot
    last: jax.Array  # [slots] int32: the last sampled token, fed at the next step
    step: jax.Array  # [slots] int32: tokens generated for the current prompt
    done: jax.Array  # [slots] bool: finished (or never used)
    keys: jax.Array  # [slots] PRNG keys of the current prompt
    tokens: jax.Array  # [slots, budget] int32 generated ids
    logprobs: jax.Array  # [slots, budget] float32 behaviour log-probs
    raw_logprobs: jax.Array  # [slots, budget] float32 temperature-1 log-probs
    temperature: jax.Array  # [slots] float32: each row's sampling settings
    top_k: jax.Array  # [slots] int32
    top_p: jax.Array  # [slots] float32
    max_new: jax.Array  # [slots] int32: the row stops after this many new tokens


def insert_arrays(k: int, t: int):
    """An insert program's host arguments for k rows of t-token blocks, zeroed: slot ids, blocks, block
    lengths, starts, seeds, row ids, and the settings (temperature, top_k, top_p, max_new)."""
    ints = lambda *shape: np.zeros(shape or (k,), np.int32)  # noqa: E731
    return (ints(), ints(k, t), ints(), ints(), np.zeros(k, np.uint32), np.zeros(k, np.uint32),
            (np.zeros(k, np.float32), ints(), np.zeros(k, np.float32), ints()))


class EnginePrograms(NamedTuple):
    """The jitted programs; `insert` and `decode` donate the state they are given."""

    empty: object  # () -> EngineState
    insert: object
    decode: object


@functools.lru_cache(maxsize=None)
def engine_programs(cfg, rules, mode: str, stop_ids: tuple[int, ...], slots: int, cache_len: int,
                    budget: int) -> EnginePrograms:
    """The engine's compiled programs, shared by every engine of the same shapes and sampling mode
    (engines come and go with rollouts; their programs must not recompile)."""
    stop_ids = np.asarray(stop_ids, np.int32)

    pick = functools.partial(sample_token, mode=mode)

    def sharded(x, axes):
        return x if rules is None else jax.lax.with_sharding_constraint(x, rules.sharding(axes, x.shape))

    def logits(params, hidden):
        return unembed(params, cfg, hidden, local=rules is None)

    def empty() -> EngineState:
        cache = KVCache(*(sharded(c, transformer.CACHE_AXES) for c in KVCache.zeros(cfg, slots, cache_len)))
        zeros = lambda dtype: sharded(jnp.zeros((slots, budget), dtype), ("batch", None))  # noqa: E731
        ints, floats = jnp.zeros((slots,), jnp.int32), jnp.ones((slots,), jnp.float32)
        return EngineState(cache, ints, ints, ints, jnp.ones((slots,), bool),
                           jax.random.split(jax.random.key(0), slots), zeros(jnp.int32), zeros(jnp.float32),
                           zeros(jnp.float32), floats, ints, floats, ints)

    def insert(params, state: EngineState, slot_ids, block, lens, starts, seeds, row_ids, settings):
        """Prefill `block` [k, T] (each row's new tokens, right-padded) after each slot's first `starts`
        cached tokens, in place in the slots' rows of the cache, attending over the whole cache; sample
        each first token and make the slots live. settings: each row's (temperature, top_k, top_p,
        max_new). Rows past the requests repeat the first one (same slot, same values)."""
        temperature, top_k, top_p, max_new = settings
        k, t = block.shape
        ends = starts + lens
        mask = jnp.arange(cache_len)[None, :] < ends[:, None]
        positions = starts[:, None] + jnp.arange(t)[None, :]
        hidden, cache = decoder(params, cfg, block, positions, mask, state.cache, starts, rules, cache_rows=slot_ids)
        last = hidden[jnp.arange(k), lens - 1]
        keys = jax.vmap(lambda s, r: jax.random.fold_in(jax.random.key(s), r))(seeds, row_ids)
        token, lp, raw = pick(logits(params, last), jax.vmap(jax.random.fold_in, (0, None))(keys, 0), temperature,
                              top_k, top_p)
        put = lambda x, new: x.at[slot_ids].set(new)  # noqa: E731
        first = lambda new: jnp.zeros((k, budget), new.dtype).at[:, 0].set(new)  # noqa: E731
        return EngineState(
            cache, put(state.length, ends), put(state.last, token), put(state.step, jnp.ones_like(token)),
            put(state.done, row_stops(token, 1, max_new, stop_ids)), put(state.keys, keys),
            put(state.tokens, first(token)), put(state.logprobs, first(lp)), put(state.raw_logprobs, first(raw)),
            put(state.temperature, temperature), put(state.top_k, top_k), put(state.top_p, top_p),
            put(state.max_new, max_new))

    def decode(params, state: EngineState, min_finished, max_steps, window):
        """Decode steps until `min_finished` rows have finished, none is live, or `max_steps` ran,
        attending over the first `window` cache slots. Returns the state and the number of steps run."""
        rows = jnp.arange(slots)

        def cond(carry):
            i, st, finished = carry
            return (i < max_steps) & ~jnp.all(st.done) & (finished < min_finished)

        def body(carry):
            i, st, finished = carry
            live = ~st.done
            mask = finished_sees_first(jnp.arange(cache_len)[None, :] <= st.length[:, None], st.done)
            hidden, cache = decoder(params, cfg, st.last[:, None], st.length[:, None], mask, st.cache,
                                    st.length, rules, kv_len=window)
            token, lp, raw = pick(logits(params, hidden[:, 0]), jax.vmap(jax.random.fold_in)(st.keys, st.step),
                                  st.temperature, st.top_k, st.top_p)
            col = jnp.where(live, st.step, budget)  # finished rows write nowhere
            step = st.step + live
            stopped = live & row_stops(token, step, st.max_new, stop_ids)
            st = st._replace(cache=cache, length=st.length + live, last=jnp.where(live, token, st.last), step=step,
                             done=st.done | stopped, tokens=st.tokens.at[rows, col].set(token, mode="drop"),
                             logprobs=st.logprobs.at[rows, col].set(lp, mode="drop"),
                             raw_logprobs=st.raw_logprobs.at[rows, col].set(raw, mode="drop"))
            return i + 1, st, finished + jnp.sum(stopped)

        steps, state, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), state, jnp.int32(0)))
        return state, steps

    return EnginePrograms(jax.jit(empty), jax.jit(insert, donate_argnums=(1,)),
                     jax.jit(decode, donate_argnums=(1,), static_argnames=("window",)))
