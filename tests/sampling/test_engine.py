"""The decode engine: the same tokens and log-probs as `Sampler.generate`, whatever the slot count,
the order prompts arrive in or the prefix a slot reuses; static shapes; clear errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.compilation import compile_count
from spiral_jax.models import cpu, init_params, transformer
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.engine_programs import engine_programs
from spiral_jax.sampling.buckets import INSERT_ROWS
from spiral_jax.sampling.engine import DecodeEngine, Request
from spiral_jax.sharding import make_mesh
from tests.tiny_models import TINY

# A random model whose 2 stop tokens of 64 end a response after about 30 tokens: lengths vary a lot.
CFG = TINY.replace(max_position_embeddings=512)
SP = SamplingParams(max_new_tokens=64, temperature=0.9, top_p=0.95, stop_token_ids=frozenset({0, 1}))


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, jax.random.key(0))


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(8, 64, rng.integers(2, 60)).tolist() for _ in range(n)]


def _run(engine, params, requests):
    """Feed the requests through the engine as slots free up; results by row id."""
    queue, out = list(requests), {}
    while queue or engine.live:
        free = len(engine.free_slots())
        engine.insert(params, queue[:free])
        queue = queue[free:]
        for f in engine.decode(params):
            out[f.request.row_id] = f
    return out


def _assert_same(got, ref, ids):
    for i, row in enumerate(ids):
        assert got[row].tokens == ref.tokens[i], f"row {row}"
        assert got[row].finish_reason == ref.finish_reasons[i]
        np.testing.assert_allclose(got[row].logprobs, ref.logprobs[i], atol=1e-5)
        np.testing.assert_allclose(got[row].raw_logprobs, ref.raw_logprobs[i], atol=1e-5)


@pytest.mark.parametrize("slots,min_finished,min_steps", [pytest.param(4, 1, 32, marks=pytest.mark.slow), (8, 3, 2),
                                                         (32, None, 32)])
def test_engine_samples_what_generate_samples(params, slots, min_finished, min_steps):
    """min_steps=2: decode calls stop a few steps short of each window's end, so rows cross
    windows (64, 96 and 128 cache slots) while others are decoding. 32 slots: the first 24 prompts
    go in at once, prefilled INSERT_ROWS at a time."""
    prompts, ids = _prompts(24), list(range(100, 124))
    sampler = Sampler(CFG, max_prompt_len=64, max_cache_len=128)
    ref = sampler.generate(params, prompts, SP, seed=9, row_ids=ids)
    engine = DecodeEngine(sampler, SP, slots, min_finished=min_finished, min_steps=min_steps)
    assert engine.windows == [64, 96, 128]
    rows, insert = [], engine._programs.insert
    engine._programs = engine._programs._replace(
        insert=lambda p, state, slot_ids, *a, **kw: rows.append(len(slot_ids)) or insert(p, state, slot_ids, *a, **kw))
    got = _run(engine, params, [Request(p, 9, i) for p, i in zip(prompts, ids)])
    _assert_same(got, ref, ids)
    assert max(rows) <= INSERT_ROWS and (slots < 24 or rows[:3] == [INSERT_ROWS] * 3), rows
    lengths = [len(t) for t in ref.tokens]
    assert len(set(lengths)) > 5 and max(lengths) == SP.max_new_tokens  # a long-tailed workload
    for stats in (engine.stats, ref.stats):
        assert stats.generated_tokens == sum(lengths) and stats.decoded_tokens == sum(lengths) - len(lengths)
        assert 0 < stats.decoded_tokens <= stats.slot_steps and stats.seconds > 0
    assert ref.stats.slot_steps == ref.batch_rows * (max(lengths) - 1)
    prompt_tokens = engine.stats.prefilled_tokens + engine.stats.reused_tokens
    assert prompt_tokens == ref.stats.prefilled_tokens == sum(map(len, prompts))


def test_rows_with_their_own_settings_sample_what_generate_samples(params):
    """Requests with other temperatures, top-p, new-token limits and seeds share the engine's slots;
    each row samples what `generate` gives with that row's settings and seed. Seeds past int32's range
    or below 0 key the engine's rows as they key the sampler's (modulo 2**32, as `jax.random.key`)."""
    prompts = _prompts(6, seed=3)
    sampler = Sampler(CFG, max_prompt_len=64, max_cache_len=128)
    settings = [SamplingParams(max_new_tokens=n, temperature=t, top_p=p, stop_token_ids=SP.stop_token_ids)
                for n, t, p in [(64, 0.9, 0.95), (5, 0.5, 0.8), (64, 1.5, 0.97), (12, 0.9, 0.5), (1, 1.0, 0.9),
                                (30, 0.7, 0.99)]]
    seeds = [4, 2**31 + 4, 4, 2**32 + 5, 4, -3]
    engine = DecodeEngine(sampler, SP, 8)
    got = _run(engine, params, [Request(p, seed, i, sampling=sp)
                                for i, (p, sp, seed) in enumerate(zip(prompts, settings, seeds))])
    for i, (p, sp, seed) in enumerate(zip(prompts, settings, seeds)):
        _assert_same(got, sampler.generate(params, [p], sp, seed=seed, row_ids=[i]), [i])
    assert len(got[1].tokens) <= 5 and len(got[4].tokens) == 1
    with pytest.raises(ValueError, match="engine's mode"):
        engine.insert(params, [Request(prompts[0], 0, 0, sampling=SamplingParams(greedy=True))])
    with pytest.raises(ValueError, match="at most 64"):
        engine.insert(params, [Request(prompts[0], 0, 0, sampling=SamplingParams(
            max_new_tokens=65, temperature=0.9, top_p=0.9, stop_token_ids=SP.stop_token_ids))])


def test_peek_and_cancel(params):
    """peek shows every live row's tokens so far (a prefix of its whole answer); a cancelled row comes
    back from the next decode with what it had, and its slot takes the next prompt."""
    prompts = _prompts(4, seed=5)
    sampler = Sampler(CFG, max_prompt_len=64, max_cache_len=128)
    sp = SamplingParams(max_new_tokens=64, temperature=0.9, top_p=0.95)  # no stop ids: every row runs to 64
    ref = sampler.generate(params, prompts, sp, seed=2)
    engine = DecodeEngine(sampler, sp, 4, max_steps=8)
    engine.insert(params, [Request(p, 2, i) for i, p in enumerate(prompts)])
    assert engine.decode(params) == []
    seen = engine.peek()
    assert sorted(seen) == [0, 1, 2, 3]
    for slot, tokens in seen.items():
        row = engine.busy[slot].row_id
        assert 1 < len(tokens) < 64 and ref.tokens[row][:len(tokens)] == tokens
    engine.cancel([0, 2])
    done = engine.decode(params)
    assert sorted(f.slot for f in done) == [0, 2] and {f.finish_reason for f in done} == {"cancelled"}
    for f in done:
        assert f.tokens == ref.tokens[f.request.row_id][:len(f.tokens)]
    assert engine.free_slots() == [0, 2]
    rest = _run(engine, params, [Request(prompts[0], 2, 0)])
    assert rest[0].tokens == ref.tokens[0] and rest[0].finish_reason == "length"


def test_a_slot_reuses_the_shared_prefix_exactly(params):
    """The second prompt in a slot starts with the first prompt (and part of its response): only the rest
    is prefilled, and the tokens and log-probs equal a full prefill's."""
    sampler = Sampler(CFG, max_prompt_len=96, max_cache_len=256)
    engine = DecodeEngine(sampler, SP, 4)
    first = _prompts(4, seed=1)
    done = _run(engine, params, [Request(p, 1, i, slot=i) for i, p in enumerate(first)])
    rng = np.random.default_rng(2)
    second = [first[0] + done[0].tokens[:-1] + [9, 10],  # the whole cached sequence, then more
              first[1][:len(first[1]) // 2] + rng.integers(8, 64, 5).tolist(),  # half the prompt
              rng.integers(8, 64, 20).tolist(),  # nothing shared
              list(first[3])]  # the same prompt again: all but its last token reused
    before = engine.stats.reused_tokens
    got = _run(engine, params, [Request(p, 2, i, slot=i) for i, p in enumerate(second)])
    _assert_same(got, sampler.generate(params, second, SP, seed=2, row_ids=range(4)), range(4))
    shared = [len(first[0]) + len(done[0].tokens) - 1, len(first[1]) // 2, 0, len(first[3]) - 1]
    assert engine.stats.reused_tokens - before >= sum(shared)
    engine.forget()
    before = engine.stats
    _run(engine, params, [Request(p, 2, i, slot=i) for i, p in enumerate(second)])
    used = engine.stats - before
    assert used.reused_tokens == 0  # forgotten: nothing reused under new parameters
    assert used.prefilled_tokens == sum(map(len, second)) and used.prefill_saved == 0


def test_a_block_past_the_cache_end_keeps_its_reused_prefix(params):
    """An insert writes its padded block into the slot's cache row in place: a prompt that reuses almost
    all of a long cached prefix, its block bucketed to 16 tokens, has padding past the cache's end. The
    row's tokens land at their slots, the prefix stays as it was, and the row samples what generate
    does; so does the other row of the same insert, whose block fits."""
    sp = SamplingParams(max_new_tokens=4, temperature=0.9, top_p=0.95)  # 4 tokens a prompt
    sampler = Sampler(CFG, max_prompt_len=63, max_cache_len=128)
    engine = DecodeEngine(sampler, sp, 2)
    assert engine.cache_len == 68
    rng = np.random.default_rng(4)
    first = [rng.integers(8, 64, 56).tolist(), rng.integers(8, 64, 30).tolist()]
    done = _run(engine, params, [Request(p, 1, i, slot=i) for i, p in enumerate(first)])
    second = [first[0] + done[0].tokens[:-1] + [9, 10, 11, 12], first[1] + done[1].tokens[:-1] + [9]]
    assert len(second[0]) == 63
    before = engine.stats.reused_tokens
    got = _run(engine, params, [Request(p, 2, i, slot=i) for i, p in enumerate(second)])
    _assert_same(got, sampler.generate(params, second, sp, seed=2, row_ids=range(2)), range(2))
    # Slot 0 reuses its 59 cached tokens: a 16-token block from slot 59 would end at 75, past slot 68.
    assert engine.stats.reused_tokens - before == 59 + len(second[1]) - 1


def test_inserts_past_the_score_budget_attend_in_query_chunks_alike(params, monkeypatch):
    """An insert whose fp32 scores would pass `transformer.SCORE_BYTES` attends in chunks of its
    queries, one after another: the same tokens and log-probs as generate's prefill at once, for fresh
    slots and for slots that reuse a prefix (each row's queries at its own slots)."""
    # Qwen3-4B on one GPU, the largest insert (2048 tokens over the 6144-slot cache) into 8 slots of 32
    # heads: 12 GiB of scores at once, 0.19 GiB in chunks of 32 queries.
    assert transformer.query_chunk(2048, 6144, 8, 32) == 32 and transformer.query_chunk(64, 96, 4, 4) == 64
    sampler = Sampler(CFG, max_prompt_len=96, max_cache_len=256)
    first = _prompts(16, seed=3)
    want_first = sampler.generate(params, first, SP, seed=4, row_ids=range(16))
    second = [p + [9, 10, 11] for p in first]  # each slot's cache holds its prompt: only the tail is new
    want_second = sampler.generate(params, second, SP, seed=5, row_ids=range(16))

    chunks = []
    query_chunk = transformer.query_chunk
    monkeypatch.setattr(transformer, "SCORE_BYTES", 1)  # every block of more than 16 queries splits
    monkeypatch.setattr(transformer, "query_chunk", lambda *a: chunks.append((a[0], query_chunk(*a))) or chunks[-1][1])
    engine_programs.cache_clear()  # traced afresh, under the small budget
    engine = DecodeEngine(sampler, SP, 16)
    _assert_same(_run(engine, params, [Request(p, 4, i, slot=i) for i, p in enumerate(first)]), want_first, range(16))
    _assert_same(_run(engine, params, [Request(p, 5, i, slot=i) for i, p in enumerate(second)]), want_second,
                 range(16))
    assert any(chunk < tokens for tokens, chunk in chunks) and all(chunk == 16 for t, chunk in chunks if t > 16)
    engine_programs.cache_clear()


def test_no_recompilation_after_warm_up(params):
    """Programs are per bucket (inserted rows, block length, attention window): a workload that has
    been through once compiles nothing more, with new parameter buffers and in a new engine."""
    sampler = Sampler(CFG, max_prompt_len=64, max_cache_len=128)
    requests = [Request(p, 3, i) for i, p in enumerate(_prompts(40, seed=3))]
    _run(DecodeEngine(sampler, SP, 8), params, requests)
    fresh = jax.block_until_ready(jax.tree.map(jnp.copy, params))
    before = compile_count()
    engine = DecodeEngine(sampler, SP, 8)  # a new engine of the same shapes shares the programs
    _run(engine, fresh, requests)
    assert compile_count() == before


@pytest.mark.slow
def test_sharded_engine_matches_single_device(params):
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    prompts, ids = _prompts(12, seed=4), list(range(12))
    ref = Sampler(CFG, max_prompt_len=64, max_cache_len=128).generate(params, prompts, SP, seed=4, row_ids=ids)
    engine = DecodeEngine(Sampler(CFG, mesh, max_prompt_len=64, max_cache_len=128), SP, 8)
    _assert_same(_run(engine, params, [Request(p, 4, i) for p, i in zip(prompts, ids)]), ref, ids)


def test_gpu_decode_weights_run_per_layer_on_a_mesh(params):
    """Traced for a GPU, `decode_weights` splits a scanned model's stacked fp32 weights per layer while
    it casts them (a scanned decode step on GPU copies each layer out of the stack); the engine places
    and decodes them, with the same tokens as the stacked weights decoded on CPU."""
    cfg = CFG.replace(scan_layers=True, compute_dtype="bfloat16", attention="xla")
    stacked = dict(params, layers=jax.tree.map(lambda *layer: jnp.stack(layer), *params["layers"]))
    prompts, ids = _prompts(8, seed=5), list(range(8))
    requests = [Request(p, 5, i) for p, i in zip(prompts, ids)]
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    engine = DecodeEngine(Sampler(cfg, mesh, max_prompt_len=64, max_cache_len=128), SP, 8)
    want = _run(engine, engine.setup.decode_weights(stacked), requests)
    with cpu.compiling_for("gpu"):
        split = engine.setup.decode_weights(stacked)
        assert isinstance(split["layers"], list) and split["layers"][0]["q"].dtype == jnp.bfloat16
        engine = DecodeEngine(Sampler(cfg, mesh, max_prompt_len=64, max_cache_len=128), SP, 8)
        got = _run(engine, split, requests)
    assert [got[i].tokens for i in ids] == [want[i].tokens for i in ids]


def test_clear_errors(params):
    sampler = Sampler(CFG, max_prompt_len=64, max_cache_len=128)
    with pytest.raises(ValueError, match="max_cache_len"):
        DecodeEngine(sampler, SamplingParams(max_new_tokens=100), 4)  # 64 + 128 slots
    with pytest.raises(ValueError, match="data shards"):
        DecodeEngine(Sampler(CFG, make_mesh(data=2, fsdp=2, tensor=2), max_prompt_len=64, max_cache_len=128),
                     SP, 6)
    engine = DecodeEngine(sampler, SP, 2)
    with pytest.raises(ValueError, match="free slots"):
        engine.insert(params, [Request([9], 0, i) for i in range(3)])
    with pytest.raises(ValueError, match="max_prompt_len"):
        engine.insert(params, [Request([9] * 65, 0, 0)])
    for slot in (-1, 2):
        with pytest.raises(ValueError, match=f"slot {slot} is outside the engine's 2 slots"):
            engine.insert(params, [Request([9], 0, 0, slot=slot)])
    engine.insert(params, [Request([9, 10], 0, 0, slot=1)])
    with pytest.raises(ValueError, match="slot 1 is not free"):
        engine.insert(params, [Request([9], 0, 1, slot=1)])
    with pytest.raises(RuntimeError, match="still decoding"):
        engine.forget()


def test_an_insert_compiles_per_rows_and_block_not_per_prefix(params):
    """A game's turns reuse ever longer prefixes in their slot. An insert attends over the whole cache,
    so turns whose new tokens fill the same block bucket run one insert program however far up the
    cache they start (a window per insert would compile one for each of the 64, 96, 128 and 144-slot
    windows here); and each turn samples what generate samples from its whole prompt."""
    engine_programs.cache_clear()
    sampler = Sampler(CFG, max_prompt_len=128, max_cache_len=144)
    sp = SamplingParams(max_new_tokens=12, temperature=0.9, stop_token_ids=frozenset({0, 1}))
    engine = DecodeEngine(sampler, sp, 1)
    assert engine.windows == [64, 96, 128, 144]
    rng = np.random.default_rng(6)
    prompt, starts = rng.integers(8, 64, 10).tolist(), []
    while len(prompt) <= 128:
        starts.append(len(engine.cached[0]))
        turn = _run(engine, params, [Request(prompt, 7, len(starts))])[len(starts)]
        assert turn.tokens == sampler.generate(params, [prompt], sp, seed=7, row_ids=[len(starts)]).tokens[0]
        prompt = prompt + turn.tokens + rng.integers(8, 64, 4).tolist()  # the answer, then the next observation
    assert max(starts) > 96 and engine._programs.insert._cache_size() == 1, starts
    engine_programs.cache_clear()
