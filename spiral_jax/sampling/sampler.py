"""Batched KV-cache sampling: prefill and the whole decode loop in one compiled program.

Shapes are static so a running trainer never recompiles: prompts are left-padded to a power-of-two
length bucket, the batch to a power-of-two batch bucket, and the new-token budget to a power-of-two
cache bucket. Prefill runs the model's own `decoder` over the prompt block and writes the cache;
decoding is a `lax.while_loop` that feeds one token per row per step and exits as soon as every row
has stopped. The cache lives inside the program, so XLA updates it in place. Only the last
position's logits are ever formed: there is no [batch, length, vocab] buffer, and the prefill's last
layer carries on with the last position only once it has cached every position's keys and values.

Decode attention reads only the part of the cache filled so far, in stages of static size: with a
4096-token budget the loop runs as three `while_loop`s that attend over the prompt plus 256, 1024
and 4096 new-token slots. Games mostly end long before the budget, and reading the whole cache every
step would cost far more memory traffic than the weights (see `attention_windows`).

Each row's randomness is `fold_in(fold_in(key(seed), row_id), step)`, so a row samples the same
tokens alone or in any batch.
"""
from __future__ import annotations

import dataclasses
import functools
import numbers
import time
import weakref
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models import cpu, transformer
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import check_params
from spiral_jax.models.transformer import (KVCache, decode_weights, decoder, positions_from_mask,
                                           unembed, unembed_table)
from spiral_jax.sampling.ahead import CompileAhead, auto_workers
from spiral_jax.sampling.buckets import attention_windows, batch_bucket, bucket_length, cache_slots
from spiral_jax.sampling.finish import check_finite, finish_reason, finished_sees_first, row_stops
from spiral_jax.sampling.logits import sample_token
from spiral_jax.sampling.params import MIN_TEMPERATURE, SamplingParams  # noqa: F401
from spiral_jax.sampling.setup import DecodeSetup
from spiral_jax.sampling.stats import DecodeStats

_transpose = jax.jit(jnp.transpose)


class _DecodeState(NamedTuple):
    """What the decode loop carries from step to step."""

    step: jax.Array  # new tokens so far (the same for every row)
    tokens: jax.Array  # [batch, budget] generated ids (0 after a row stops)
    logprobs: jax.Array  # [batch, budget] behaviour log-probs
    raw_logprobs: jax.Array  # [batch, budget] temperature-1 log-probs
    done: jax.Array  # [batch] stopped
    lengths: jax.Array  # [batch] tokens generated per row
    cache: KVCache
    kv_mask: jax.Array  # [batch, slots] cache slots holding real tokens


@dataclasses.dataclass
class SampleOutput:
    """Per row: generated ids (stop token included, nothing after), their log-probs, finish reason;
    and what the call cost."""

    tokens: list[list[int]]
    logprobs: list[np.ndarray]  # under the distribution sampled from (tempered, truncated)
    raw_logprobs: list[np.ndarray]  # temperature 1, full vocabulary
    finish_reasons: list[str]  # "stop" or "length"
    batch_rows: int = 0  # rows the call decoded, padding included: its decode slot-steps are rows x steps
    stats: DecodeStats = dataclasses.field(default_factory=DecodeStats)  # the call's seconds and tokens


class Sampler:
    """Generates continuations for many prompts at once with one compiled program per bucket.

    max_prompt_len / max_cache_len bound the prompt and prompt+generation lengths (after bucketing);
    they default to the model's max_position_embeddings. first_window: new-token slots the first
    decode stage attends over (see `attention_windows`). The settings before it are its `setup`; the
    attributes named after the setup's fields read it. compile_ahead: threads that compile, while a
    call runs, the programs of the smaller batch buckets at its prompt bucket, which a rollout's later
    rounds need as their games end (and a `DecodeEngine`'s larger windows; `sampling.ahead`); None:
    `auto_workers()` (none on a CPU).
    """

    def __init__(self, cfg: ModelConfig, mesh=None, max_prompt_len: int | None = None,
                 max_cache_len: int | None = None, min_prompt_bucket: int = 16, min_batch_bucket: int = 1,
                 first_window: int = 256, compile_ahead: int | None = None):
        self.setup = DecodeSetup.create(cfg, mesh, max_prompt_len, max_cache_len, min_prompt_bucket,
                                        min_batch_bucket)
        if isinstance(first_window, bool) or not isinstance(first_window, numbers.Integral) or first_window < 1:
            raise ValueError(f"first_window must be an int >= 1 (new-token slots), got {first_window!r}")
        self.first_window = first_window
        self.ahead = CompileAhead(auto_workers(cpu.platform()) if compile_ahead is None else compile_ahead)
        self._table_t = (None, None)  # (weak reference to an unembedding table, its transposed copy)
        self._program = self._compile_program()

    cfg = property(lambda self: self.setup.cfg)
    rules = property(lambda self: self.setup.rules)
    max_prompt_len = property(lambda self: self.setup.max_prompt_len)
    max_cache_len = property(lambda self: self.setup.max_cache_len)
    min_prompt_bucket = property(lambda self: self.setup.min_prompt_bucket)
    min_batch_bucket = property(lambda self: self.setup.min_batch_bucket)
    params_sharding = property(lambda self: self.setup.params_sharding)

    def _one_row_table(self, params, batch: int) -> jax.Array | None:
        """A [D, V] copy of the unembedding table for one-row calls on a single CPU device, else None.

        A one-row unembedding streams the whole table every decode step, and XLA:CPU streams a [D, V]
        table about twice as fast as the stored [V, D] one (docs/performance.md). The copy is kept until
        a one-row call brings another table; it holds no reference to the table it was made from.
        """
        if batch != 1 or self.rules is not None or not cpu.layouts():
            return None
        table = unembed_table(params, self.cfg)
        source, table_t = self._table_t
        if source is None or source() is not table:
            table_t = _transpose(table)
            self._table_t = (weakref.ref(table), table_t)
        return table_t

    def _compile_program(self):
        cfg, rules = self.cfg, self.rules

        @functools.partial(jax.jit, static_argnames=("slots", "mode"))
        def program(params, table_t, prompt, prompt_mask, key, row_ids, max_new, temperature, top_k, top_p,
                    stop_ids, real_rows, *, slots, mode):
            batch, plen = prompt.shape
            budget = slots - plen  # output buffer length (the new-token bucket)
            params = decode_weights(params, cfg)  # once per call, not per decode step
            pick = functools.partial(sample_token, temperature=temperature, top_k=top_k, top_p=top_p,
                                     mode=mode)
            keys = jax.vmap(jax.random.fold_in, (None, 0))(key, row_ids)
            step_keys = lambda step: jax.vmap(jax.random.fold_in, (0, None))(keys, step)  # noqa: E731
            logits = lambda hidden: unembed(params, cfg, hidden, table_t, local=rules is None)  # noqa: E731

            kv_mask = jnp.zeros((batch, slots), bool).at[:, :plen].set(prompt_mask.astype(bool))
            positions = positions_from_mask(prompt_mask)
            cache = KVCache.zeros(cfg, batch, slots)
            if rules is not None:
                cache = KVCache(*(jax.lax.with_sharding_constraint(
                    c, rules.sharding(transformer.CACHE_AXES, c.shape))
                    for c in cache))
            hidden, cache = decoder(params, cfg, prompt, positions, kv_mask, cache, 0, rules, last_only=True)
            token, lp, raw = pick(logits(hidden[:, -1]), step_keys(0))

            state = _DecodeState(
                step=jnp.int32(1), tokens=jnp.zeros((batch, budget), jnp.int32).at[:, 0].set(token),
                logprobs=jnp.zeros((batch, budget), jnp.float32).at[:, 0].set(lp),
                raw_logprobs=jnp.zeros((batch, budget), jnp.float32).at[:, 0].set(raw),
                # The batch bucket's padding rows start done: the loop ends when the real rows do.
                done=row_stops(token, 1, max_new, stop_ids) | (jnp.arange(batch) >= real_rows),
                lengths=jnp.ones((batch,), jnp.int32), cache=cache, kv_mask=kv_mask)
            next_pos = positions[:, -1] + 1

            def decode(state: _DecodeState, window: int) -> _DecodeState:
                """Decode steps while the previous token's slot is inside `window`."""
                def cond(st: _DecodeState):
                    return (st.step < max_new) & (plen + st.step <= window) & ~jnp.all(st.done)

                def body(st: _DecodeState):
                    slot = plen + st.step - 1  # where the previous token goes
                    kv_mask = st.kv_mask.at[:, slot].set(True)
                    pos = (next_pos + st.step - 1)[:, None]
                    hidden, cache = decoder(params, cfg, st.tokens[:, st.step - 1][:, None], pos,
                                            finished_sees_first(kv_mask, st.done), st.cache, slot, rules,
                                            kv_len=window)
                    token, lp, raw = pick(logits(hidden[:, 0]), step_keys(st.step))
                    live = ~st.done
                    return _DecodeState(
                        step=st.step + 1, tokens=st.tokens.at[:, st.step].set(jnp.where(live, token, 0)),
                        logprobs=st.logprobs.at[:, st.step].set(jnp.where(live, lp, 0.0)),
                        raw_logprobs=st.raw_logprobs.at[:, st.step].set(jnp.where(live, raw, 0.0)),
                        done=st.done | row_stops(token, st.step + 1, max_new, stop_ids), lengths=st.lengths + live,
                        cache=cache, kv_mask=kv_mask)

                return jax.lax.while_loop(cond, body, state)

            for window in attention_windows(plen, slots, self.first_window):
                state = decode(state, window)
            return state.tokens, state.logprobs, state.raw_logprobs, state.lengths

        return program

    def check_prompts(self, prompts: Sequence[Sequence[int]]) -> None:
        """Raise a ValueError naming the first prompt that is empty, too long or outside the vocabulary."""
        self.setup.check_prompts(prompts)

    def _buckets(self, prompts: Sequence[Sequence[int]], sp: SamplingParams) -> tuple[int, int]:
        """The prompt bucket and cache slots of one generate call."""
        longest = max(len(p) for p in prompts)
        plen = bucket_length(longest, self.min_prompt_bucket)
        slots = cache_slots(plen, sp.max_new_tokens)
        if slots > self.max_cache_len:
            raise ValueError(
                f"max_new_tokens={sp.max_new_tokens} does not fit the KV cache: the prompt bucket "
                f"({plen} tokens for a longest prompt of {longest}) plus the new-token bucket "
                f"({slots - plen}) is {slots} > max_cache_len={self.max_cache_len}; lower "
                f"max_new_tokens, shorten the prompts or raise max_cache_len")
        return plen, slots

    def generate(self, params, prompts: Sequence[Sequence[int]], sampling_params: SamplingParams,
                 seed: int = 0, row_ids: Sequence[int] | None = None) -> SampleOutput:
        """Sample a continuation of every prompt. row_ids (default 0..n-1) key each row's randomness."""
        start = time.perf_counter()
        sp = sampling_params
        args, static = self._arguments(params, prompts, sp, seed, row_ids)
        n = len(prompts)
        batch = args[2].shape[0]  # rows of the padded prompt
        self._compile_smaller(params, max(map(len, prompts)), sp, batch)
        self.ahead.wait(_program_key(args, static))
        out, lp, raw, lengths = jax.device_get(self._program(*args, **static))
        check_finite(raw[:n], lengths[:n])
        result = SampleOutput([], [], [], [], batch)
        for i in range(n):
            k = int(lengths[i])
            result.tokens.append(out[i, :k].tolist())
            result.logprobs.append(lp[i, :k])
            result.raw_logprobs.append(raw[i, :k])
            result.finish_reasons.append(finish_reason(result.tokens[-1], sp.stop_token_ids))
        generated = sum(len(t) for t in result.tokens)
        # Each row's first token comes from the prefill; every row, padding included, runs every step.
        result.stats = DecodeStats(time.perf_counter() - start, generated, generated - n,
                                   batch * (max(len(t) for t in result.tokens) - 1), sum(len(p) for p in prompts))
        return result

    def _compile_smaller(self, params, longest: int, sp: SamplingParams, batch: int) -> None:
        """Queue the programs of the batch buckets below `batch` for prompts as long as `longest`."""
        if not self.ahead.workers:
            return
        plen, slots = self._buckets([[0] * longest], sp)
        held = _held_weakly(params)
        rows = batch // 2
        while rows >= self.min_batch_bucket and batch_bucket(rows, self.min_batch_bucket) == rows:
            if (key := ((rows, plen), slots, sp.mode)) not in self.ahead:
                self.ahead.submit(key, functools.partial(self._lower_ahead, held, [[0] * longest] * rows, sp))
            rows //= 2

    def _lower_ahead(self, held, prompts, sp: SamplingParams) -> jax.stages.Lowered | None:
        """The program for these prompts, lowered on an `ahead` thread for the caller's parameters while
        they live (a later call with arrays of the same types runs it); None, withdrawing the job, once
        the caller has dropped them. A job no thread takes before a rollout's end so holds no copy of
        the weights made for sampling (merged LoRA weights, the sampling layout's) into the training step.

        The parameters themselves, not their shapes: a call with uncommitted arrays runs only a program
        lowered for such arrays (lowering reads their types: a donated one will do)."""
        params = held()
        if params is None:
            return None
        args, static = self._arguments(params, prompts, sp, 0, None)
        return self._program.lower(*args, **static)

    def lower(self, params, prompts: Sequence[Sequence[int]], sampling_params: SamplingParams) -> jax.stages.Lowered:
        """The program `generate` runs for these prompts, lowered (not run): for its compiled memory
        analysis or cost, e.g. to check a memory plan against XLA.

        `params` may be a tree of `jax.ShapeDtypeStruct`s placed by their `sharding`: the program is
        then lowered for devices this process need not be able to run on (`spiral_jax.aot`)."""
        abstract = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params))
        args, static = self._arguments(params, prompts, sampling_params, 0, None, place=not abstract)
        if abstract:
            prompt, mask, key = args[2], args[3], args[4]
            rows = self.rules.sharding(("batch", "seq"), prompt.shape) if self.rules else None
            replicated = self.rules.replicated() if self.rules else None
            args = (*args[:2], jax.ShapeDtypeStruct(prompt.shape, prompt.dtype, sharding=rows),
                    jax.ShapeDtypeStruct(mask.shape, mask.dtype, sharding=rows),
                    jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated), *args[5:])
        return self._program.lower(*args, **static)

    def _arguments(self, params, prompts, sp: SamplingParams, seed: int, row_ids, place: bool = True):
        """The sampling program's arguments for these prompts: left-aligned into their buckets, placed
        on the mesh (unless not `place`); (positional, static keyword) arguments."""
        if not isinstance(sp, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(sp).__name__}")
        check_params(self.cfg, params)
        self.check_prompts(prompts)
        seed = _key_part("seed", seed)
        plen, slots = self._buckets(prompts, sp)
        n = len(prompts)
        batch = batch_bucket(n, self.min_batch_bucket)
        prompt = np.zeros((batch, plen), np.int32)
        mask = np.zeros((batch, plen), np.int32)
        for i, p in enumerate(prompts):
            prompt[i, plen - len(p):] = p
            mask[i, plen - len(p):] = 1
        mask[n:, -1] = 1  # padding rows: one dummy token, so every row has a real last position
        ids = np.arange(n) if row_ids is None else np.asarray([_key_part("a row id", r) for r in row_ids])
        if len(ids) != n:
            raise ValueError(f"row_ids has {len(ids)} entries for {n} prompts")
        ids = np.concatenate([ids, np.full(batch - n, 2**32 - 1)]).astype(np.uint32)
        if self.rules is not None and place:
            params = jax.device_put(params, self.params_sharding)
            rows = self.rules.sharding(("batch", "seq"), prompt.shape)
            prompt, mask = jax.device_put(prompt, rows), jax.device_put(mask, rows)
        args = (params, self._one_row_table(params, batch), prompt, mask, jax.random.key(seed), ids,
                np.int32(sp.max_new_tokens), np.float32(sp.temperature), np.int32(sp.top_k), np.float32(sp.top_p),
                sp.stop_array(), np.int32(n))
        return args, dict(slots=slots, mode=sp.mode)


def _key_part(name: str, value) -> int:
    """A seed or row id as the programs key randomness with it: modulo 2**32, as `jax.random.key` keeps
    32 bits of a seed and a `DecodeEngine` takes both. A float (whose whole part would be taken) or a JAX
    key is refused here rather than deep inside jax.random."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return int(value) % 2**32


def _held_weakly(tree):
    """A function that returns `tree` while every array in it is alive, else None: what holds the
    parameters for a queued compile without keeping them alive."""
    def ref(x):
        try:
            return weakref.ref(x)
        except TypeError:  # a scalar (no weak references): nothing worth freeing
            return lambda: x

    leaves, treedef = jax.tree.flatten(tree)
    refs = [ref(x) for x in leaves]

    def get():
        alive = [r() for r in refs]
        return None if any(x is None for x in alive) else jax.tree.unflatten(treedef, alive)

    return get


def _program_key(args, static) -> tuple:
    """What tells a generate call's programs apart, but the parameters' types: the prompt block's
    shape (which also decides whether a transposed unembedding is passed), the cache slots and the
    sampling mode."""
    return args[2].shape, static["slots"], static["mode"]
