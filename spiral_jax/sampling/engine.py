"""A slot-based decode engine: continuous batching over one persistent KV cache.

`Sampler.generate` decodes a batch until its longest row stops, so rows that finish early idle until
then. The engine instead keeps N decode slots. Each slot holds one sequence, left-aligned in its row
of the cache: its tokens sit at slots 0, 1, ... of the row, so a token's cache slot is also its RoPE
position and a row's valid keys are exactly the first `length` slots. The host

- `insert`s new prompts into free slots: one compiled prefill for up to `INSERT_ROWS` of them, which
  also samples each one's first token;
- `decode`s: a compiled `while_loop` that feeds one token to every live slot per step and hands
  control back as soon as some rows have finished (or after a fixed number of steps);
- reads the finished rows and frees their slots for the next prompts.

A slot remembers the tokens in its cache. When the next prompt put in the same slot starts with some
of them (a game's next turn: the chat template's head and the game's rules), only the rest is
prefilled; the reused keys and values are those a full prefill would compute, at the same positions.

Each slot keeps its own temperature, top-k, top-p and new-token limit (a request's `sampling`, by
default the engine's); the sampling mode and stop ids are the engine's. The host can `cancel` a live
row, and `peek` at the tokens every live row has so far.

Every shape is static (the batch of inserted prompts and their length are bucketed), so after warm-up
nothing recompiles. A turn's randomness is `fold_in(fold_in(key(seed), row_id), step)`, the sampler's
scheme, with the seed and row id given per prompt: tokens do not depend on which slot a prompt lands
in, on what else is in flight, or on when the host collects it.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Sequence

import jax
import numpy as np

from spiral_jax.models.params import check_params
from spiral_jax.sampling.ahead import CompileAhead
from spiral_jax.sampling.buckets import INSERT_ROWS, bucket_length, engine_windows, halvings, insert_rows
from spiral_jax.sampling.engine_programs import engine_programs, insert_arrays
from spiral_jax.sampling.finish import check_finite, finish_reason
from spiral_jax.sampling.sampler import Sampler, SamplingParams
from spiral_jax.sampling.setup import DecodeSetup
from spiral_jax.sampling.stats import DecodeStats


@dataclasses.dataclass(frozen=True)
class Request:
    """A prompt to continue. seed and row_id key its randomness (see the module docstring)."""

    prompt: Sequence[int]
    seed: int
    row_id: int
    slot: int | None = None  # this slot (e.g. the one holding the same game's last turn), else any free
    tag: object = dataclasses.field(default=None, compare=False)  # the caller's, handed back with the result
    sampling: SamplingParams | None = None  # this row's settings (same mode and stop ids); None: the engine's


@dataclasses.dataclass
class Finished:
    """A prompt's continuation, as `SampleOutput` gives it for one row."""

    request: Request
    slot: int
    tokens: list[int]
    logprobs: np.ndarray
    raw_logprobs: np.ndarray
    finish_reason: str  # "stop", "length", or "cancelled" (by `cancel`)


class DecodeEngine:
    """N decode slots for one set of parameters and one `SamplingParams`.

    sampler: the `Sampler` whose `setup` (model, sharding rules, prompt and cache limits, buckets) the
        engine decodes with, and whose `ahead` threads compile the programs it will likely run next
        (the decode of each window its rows grow into, inserts of fewer rows and shorter blocks); or
        that `DecodeSetup` itself (nothing compiled ahead).
    min_finished: `decode` returns once this many rows have finished since it was called (or none is
        left running); None: an eighth of the slots. Fewer means more host round trips, more means
        finished slots idle longer before new prompts take them.
    max_steps: `decode` returns after at most this many steps even if no row has finished.
    min_steps: decode steps a call's attention window leaves room for (unless the cache ends first).
        Fewer means smaller windows but shorter calls; each window size compiles its own program.
    """

    def __init__(self, sampler: Sampler | DecodeSetup, sampling: SamplingParams, slots: int, *,
                 min_finished: int | None = None, max_steps: int = 256, min_steps: int = 32):
        if slots < 1:
            raise ValueError(f"the engine needs at least one slot, got {slots}")
        setup = self.setup = sampler if isinstance(sampler, DecodeSetup) else sampler.setup
        if slots % setup.min_batch_bucket:
            raise ValueError(f"{slots} slots do not split over the mesh's {setup.min_batch_bucket} data shards; "
                             f"use a multiple")
        self.sampling, self.slots = sampling, slots
        self.min_finished = max(1, slots // 8) if min_finished is None else min_finished
        self.max_steps, self.min_steps = max_steps, min_steps
        self.budget = bucket_length(sampling.max_new_tokens, 1)
        self.cache_len = bucket_length(setup.max_prompt_len, setup.min_prompt_bucket) + self.budget
        # Decode attends over the first `window` cache slots, the smallest size on this ladder that
        # holds every row's tokens and room for some steps (rows are left-aligned): reading the
        # unfilled rest of the cache every step would cost time only. Each size compiles its own
        # decode program. An insert attends over the whole cache: it runs once a turn, where decode
        # runs once a token, and a window per insert would multiply its programs (rows x block
        # length) by the ladder's length, each a compile of the whole model.
        self.windows = engine_windows(self.cache_len)
        if self.cache_len > setup.max_cache_len:
            raise ValueError(
                f"max_prompt_len={setup.max_prompt_len} plus the {self.budget}-token budget is "
                f"{self.cache_len} cache slots > max_cache_len={setup.max_cache_len}; lower "
                f"max_new_tokens or max_prompt_len, or raise max_cache_len")
        self._programs = engine_programs(setup.cfg, setup.rules, sampling.mode, tuple(sampling.stop_array()), slots,
                                   self.cache_len, self.budget)
        self.ahead = sampler.ahead if isinstance(sampler, Sampler) else CompileAhead(0)
        self.state = None
        self._ahead_params = None  # the weights the `ahead` threads lower for, until `forget`
        self.cached: list[list[int]] = [[] for _ in range(slots)]  # the tokens each slot's cache holds
        self.busy: list[Request | None] = [None] * slots
        self.lengths = [0] * slots  # tokens in each slot's cache (as of the last call)
        self.cancelled: set[int] = set()  # live slots `cancel` stopped, reported by the next decode
        # Running totals; seconds: time spent in `insert` and `decode` (slot-steps: every slot, live or
        # not, in every decode step).
        self.stats = DecodeStats()

    # --------------------------------------------------------------------------------- host side

    def _decode_window(self) -> tuple[int, int]:
        """(the longest live row's length, a decode call's window: the smallest that leaves room for
        min_steps more tokens, or the whole cache)."""
        longest = max(self.lengths[s] for s, r in enumerate(self.busy) if r is not None)
        return longest, next(w for w in self.windows if w >= min(longest + self.min_steps, self.cache_len))

    def forget(self) -> None:
        """Free the KV cache and what the slots remember of it, so no prefix is reused: call it when the
        parameters change (a cached key is only valid for the weights that computed it) and when the
        memory is needed elsewhere (a training step's update). The next insert starts a new cache."""
        if any(r is not None for r in self.busy):
            raise RuntimeError("forget() with prompts still decoding; collect them first")
        self.state = self._ahead_params = None
        self.cached = [[] for _ in range(self.slots)]

    def _settings(self, r: Request) -> SamplingParams:
        sp = r.sampling or self.sampling
        if sp.mode != self.sampling.mode or sp.stop_token_ids != self.sampling.stop_token_ids:
            raise ValueError(f"a request's sampling must have the engine's mode ({self.sampling.mode}) and stop ids; "
                             f"got mode {sp.mode}: use one engine per mode")
        if sp.max_new_tokens > self.sampling.max_new_tokens:
            raise ValueError(f"a request asks for {sp.max_new_tokens} new tokens; this engine allows at most "
                             f"{self.sampling.max_new_tokens}")
        return sp

    def cancel(self, slots: Sequence[int]) -> None:
        """Stop these live rows now: the next `decode` returns them, finish reason "cancelled", with the
        tokens they have so far, and frees their slots."""
        slots = [s for s in slots if self.busy[s] is not None and s not in self.cancelled]
        if slots:
            self.state = self.state._replace(done=self.state.done.at[np.asarray(slots)].set(True))
            self.cancelled.update(slots)

    def peek(self) -> dict[int, list[int]]:
        """The tokens each live slot has generated so far, by slot (for streaming)."""
        live = [s for s, r in enumerate(self.busy) if r is not None]
        if not live:
            return {}
        tokens, step = jax.device_get((self.state.tokens, self.state.step))
        return {s: tokens[s, :int(step[s])].tolist() for s in live}

    def lower(self, params) -> dict[str, jax.stages.Lowered]:
        """The engine's largest programs lowered, for their compiled memory (`spiral_jax.aot`): "insert"
        (`insert_rows` prompts of the longest prompt bucket), "decode" (over the whole cache). `params`
        may be abstract, as for `Sampler.lower`; weights and state go where their programs put them,
        host arrays everywhere."""
        placed = lambda shapes, shardings: jax.tree.map(  # noqa: E731
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)
        cast = jax.jit(self.setup.decode_weights).lower(params).compile()
        weights = placed(cast.out_info, cast.output_shardings)
        if self.setup.rules is None:  # one device: the parameters'
            everywhere = jax.tree.leaves(cast.output_shardings)[0]
            state = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=everywhere),
                                 jax.eval_shape(self._programs.empty))
        else:
            everywhere, empty = self.setup.rules.replicated(), self._programs.empty.lower().compile()
            state = placed(empty.out_info, empty.output_shardings)
        host = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=everywhere)  # noqa: E731
        arrays = insert_arrays(insert_rows(self.slots), bucket_length(self.setup.max_prompt_len,
                                                                       self.setup.min_prompt_bucket))
        insert = self._programs.insert.lower(weights, state, *jax.tree.map(host, arrays))
        decode = self._programs.decode.lower(weights, state, *map(host, (np.int32(0),) * 2), window=self.cache_len)
        return {"insert": insert, "decode": decode}

    def free_slots(self) -> list[int]:
        return [i for i, r in enumerate(self.busy) if r is None]

    @property
    def live(self) -> int:
        return self.slots - len(self.free_slots())

    def insert(self, params, requests: Sequence[Request]) -> None:
        """Start each request in its own slot (`Request.slot`, else a free one, preferring slots that
        hold nothing another request asked for). Only the part of a prompt after what the slot's cache
        already holds is prefilled. Raises if there are not enough free slots."""
        if not requests:
            return
        start = time.perf_counter()
        check_params(self.setup.cfg, params)
        if self.state is None:
            self.state = self._programs.empty()
        free = self.free_slots()
        wanted = {r.slot for r in requests if r.slot is not None}
        spare = [s for s in free if s not in wanted]
        chosen = []
        for r in requests:
            if r.slot is not None:
                if not 0 <= r.slot < self.slots:
                    raise ValueError(f"slot {r.slot} is outside the engine's {self.slots} slots (0 to {self.slots - 1})")
                if self.busy[r.slot] is not None or r.slot in chosen:
                    raise ValueError(f"slot {r.slot} is not free")
                chosen.append(r.slot)
            elif spare:
                chosen.append(spare.pop(0))
            else:
                raise ValueError(f"{len(requests)} requests for {len(free)} free slots")
        self.setup.check_prompts([r.prompt for r in requests])
        settings = [self._settings(r) for r in requests]
        starts, blocks = [], []
        for r, slot in zip(requests, chosen):
            prompt = list(r.prompt)
            reuse = _common_prefix(self.cached[slot], prompt, len(prompt) - 1)
            starts.append(reuse)
            blocks.append(prompt[reuse:])
            self.cached[slot], self.busy[slot] = prompt, dataclasses.replace(r, slot=slot)
            self.lengths[slot] = len(prompt)
        params = self.setup.place(params)
        if self.ahead.workers:
            self._ahead_params = params
        self._decode_ahead()  # beside the insert's own program
        for first in range(0, len(requests), INSERT_ROWS):  # bounded transients: see INSERT_ROWS
            group = slice(first, first + INSERT_ROWS)
            self._prefill(params, requests[group], chosen[group], starts[group], blocks[group], settings[group])
        self.stats += DecodeStats(time.perf_counter() - start, prefilled_tokens=sum(map(len, blocks)),
                                  reused_tokens=sum(starts))

    def _prefill(self, params, requests, chosen, starts, blocks, settings) -> None:
        """One insert program: each block after its slot's first `starts` cached tokens."""
        k, t = insert_rows(len(requests)), bucket_length(max(map(len, blocks)), self.setup.min_prompt_bucket)
        arrays = insert_arrays(k, t)
        slot_ids, block, lens, start_arr, seeds, row_ids, (temperature, top_k, top_p, max_new) = arrays
        for i in range(k):  # padding rows repeat the first request: they compute and write the same
            j = i if i < len(requests) else 0
            block[i, :len(blocks[j])], lens[i], start_arr[i], slot_ids[i] = blocks[j], len(blocks[j]), starts[j], chosen[j]
            seeds[i], row_ids[i] = requests[j].seed % (1 << 32), requests[j].row_id % (1 << 32)
            sp = settings[j]
            temperature[i], top_k[i], top_p[i], max_new[i] = sp.temperature, sp.top_k, sp.top_p, sp.max_new_tokens
        self._insert_ahead(k, t)
        self.ahead.wait((self._programs, k, t))
        self.state = self._programs.insert(params, self.state, *arrays)

    def _lower(self, program, *args, **static) -> jax.stages.Lowered | None:
        """`program` lowered, on an `ahead` thread, for the weights and cache the engine holds when the
        thread takes the job (a later call of the same types runs it); None, withdrawing the job, once
        `forget` has dropped them. A job queued near a rollout's end so holds no copy of the weights
        (a rollout casts its own) into the training step."""
        params, state = self._ahead_params, self.state
        if params is None or state is None:
            return None
        return program.lower(params, state, *args, **static)

    def _insert_ahead(self, rows: int, tokens: int) -> None:
        """Queue, for the `ahead` threads, the inserts of fewer rows than this one and of the next
        shorter block: after a batch's first prompts, slots free one or two at a time, and a game's
        later turns prefill only what it added since the slot's last turn. Each shape's first use
        queues its next shorter block, not every smaller shape: most of those a run never meets, and
        each is a compile of the whole model."""
        if not self.ahead.workers:
            return
        shorter = halvings(tokens, self.setup.min_prompt_bucket)[1:2]
        for k, t in [(k, tokens) for k in reversed(halvings(rows, 1)[1:])] + [(rows, t) for t in shorter]:
            if (key := (self._programs, k, t)) not in self.ahead:
                self.ahead.submit(key, functools.partial(self._lower, self._programs.insert, *insert_arrays(k, t)))

    def _decode_ahead(self) -> None:
        """Queue, for the `ahead` threads, the decode programs of the window the next decode takes and
        of every larger one its rows grow into (the first calls run a few steps each: the smallest
        window that holds their rows leaves room for `min_steps`)."""
        if not self.ahead.workers:
            return
        for w in self.windows[self.windows.index(self._decode_window()[1]):]:
            self.ahead.submit((self._programs, w), functools.partial(
                self._lower, self._programs.decode, np.int32(0), np.int32(0), window=w))

    def decode(self, params) -> list[Finished]:
        """Run decode steps until some rows finish; return them (their slots are free again)."""
        if self.state is None or self.live == 0:
            return []
        start = time.perf_counter()
        params = self.setup.place(params)
        live = self.live
        longest, window = self._decode_window()
        max_steps = min(self.max_steps, window - longest)
        self.ahead.wait((self._programs, window))
        self.state, steps = self._programs.decode(params, self.state, np.int32(min(self.min_finished, live)),
                                                 np.int32(max_steps), window=window)
        done, step, lengths = jax.device_get((self.state.done, self.state.step, self.state.length))
        self.lengths = lengths.tolist()
        ready = [s for s in range(self.slots) if self.busy[s] is not None and done[s]]
        out = []
        if ready:
            tokens, lp, raw = jax.device_get((self.state.tokens, self.state.logprobs, self.state.raw_logprobs))
            check_finite(raw[ready], step[ready])
            for s in ready:
                n = int(step[s])
                ids = tokens[s, :n].tolist()
                reason = finish_reason(ids, self.sampling.stop_token_ids, cancelled=s in self.cancelled)
                out.append(Finished(self.busy[s], s, ids, lp[s, :n], raw[s, :n], reason))
                self.cancelled.discard(s)
                self.cached[s] = self.cached[s] + ids[:-1]  # the last token was sampled, never fed
                self.busy[s] = None
        generated = sum(len(f.tokens) for f in out)
        # Each row's first token comes from its prefill.
        self.stats += DecodeStats(time.perf_counter() - start, generated, generated - len(out),
                                  int(steps) * self.slots)
        return out


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading tokens a and b share, at most `limit`."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y or i >= limit), min(len(a), len(b), limit))
