"""Compiling ahead: the sampler's smaller batch buckets compile on background threads, once each, and
the calls that need them later run those programs without compiling again."""
import gc
import threading
import time
import weakref

import jax
import pytest

from spiral_jax.compilation import compile_count
from spiral_jax.models import cpu, load_pretrained
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.ahead import WAIT_EVENT, CompileAhead, auto_workers

PROMPTS = [[5, 6, 7, 8, 9], [1, 2, 3], [9] * 20, [4, 4]]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from tests.tiny_models import make_hf_model

    path = tmp_path_factory.mktemp("qwen3")
    make_hf_model("qwen3", path)
    return load_pretrained(path)


def test_smaller_buckets_compile_ahead_and_are_not_compiled_again(qwen3):
    cfg, params = qwen3
    sp = SamplingParams(max_new_tokens=6)
    ahead = Sampler(cfg, compile_ahead=2)
    first = ahead.generate(params, PROMPTS, sp, seed=3)
    queued = [((rows, 32), 32 + 8, "plain") for rows in (2, 1)]  # prompt bucket 32, 8 new-token slots
    assert all(key in ahead.ahead for key in queued)
    ahead.ahead.join()  # not wait(key), which takes back a program no thread has begun
    before = compile_count()
    two = ahead.generate(params, PROMPTS[2:], sp, seed=3, row_ids=[2, 3])
    one = ahead.generate(params, PROMPTS[2:3], sp, seed=3, row_ids=[2])  # the 20 tokens keep bucket 32
    assert compile_count() == before, "a bucket compiled ahead was compiled again"
    # The same tokens as a sampler that compiles each program when a call first needs it.
    plain = Sampler(cfg, compile_ahead=0)
    assert plain.generate(params, PROMPTS, sp, seed=3).tokens == first.tokens
    assert two.tokens == first.tokens[2:] and one.tokens == first.tokens[2:3]
    assert plain.ahead.workers == 0 and not any(key in plain.ahead for key in queued)


def test_a_call_waits_for_its_program_compiling_ahead(qwen3):
    """A call that needs a program still compiling in the background waits for it (and says so to
    jax.monitoring) instead of compiling it a second time."""
    cfg, params = qwen3
    sp = SamplingParams(max_new_tokens=5, greedy=True)
    sampler = Sampler(cfg, compile_ahead=1)
    submit = sampler.ahead.submit
    # A slow compile that begins only once the count below is taken, however long the first call takes.
    counted = threading.Event()
    sampler.ahead.submit = lambda key, lower: submit(key, lambda: (counted.wait(60), time.sleep(1.0)) and lower())
    waits = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: waits.append(seconds) if event == WAIT_EVENT else None)
    sampler.generate(params, PROMPTS, sp)  # 4 rows: queues 2 rows, then 1 row, behind a second each
    before = compile_count()
    counted.set()
    sampler.generate(params, PROMPTS[1:3], sp)  # the 20-token prompt keeps the prompt bucket
    sampler.generate(params, PROMPTS[2:3], sp)
    assert compile_count() == before + 2, "the background's two programs, and no second compile of either"
    assert waits and max(waits) > 0.5


def _gated(gate: threading.Event, compiled: list):
    """A stand-in lowering whose compile waits for `gate`, then notes its name in `compiled`."""

    class Lowered:
        def __init__(self, name):
            self.name = name

        def compile(self):
            gate.wait(5)
            compiled.append(self.name)

    return Lowered


def _busy(ahead: CompileAhead) -> tuple[threading.Event, list]:
    """Occupy `ahead`'s one thread with a compile that waits at the returned gate, so that what is
    submitted next stays queued; (the gate, the names compiled)."""
    gate, compiled, began = threading.Event(), [], threading.Event()
    ahead.submit("busy", lambda: began.set() or _gated(gate, compiled)("busy"))
    assert began.wait(30)
    return gate, compiled


def test_compile_ahead_queue():
    """Each key is compiled once; a failed compile is dropped; a job whose lowering returns None is
    withdrawn, to be queued again; the job sees the submitter's context."""
    ahead = CompileAhead(workers=2)
    seen, gate = [], threading.Event()

    class Lowered:
        def __init__(self, fail=False):
            self.fail = fail

        def compile(self):
            gate.wait(5)
            if self.fail:
                raise RuntimeError("out of host memory")
            seen.append(cpu.platform())

    with cpu.compiling_for("tpu"):
        assert ahead.submit("a", Lowered)
    assert not ahead.submit("a", Lowered), "a key is queued once"
    assert ahead.submit("b", lambda: Lowered(fail=True))
    assert ahead.submit("gone", lambda: None)
    assert "a" in ahead and "b" in ahead and "c" not in ahead
    gate.set()
    assert ahead.join(5)
    ahead.wait("c")  # never queued: no wait
    assert seen == ["tpu"]
    assert "gone" not in ahead and ahead.submit("gone", Lowered) and ahead.join(5) and seen == ["tpu", "cpu"]
    assert not CompileAhead(workers=0).submit("a", Lowered)


def test_a_caller_takes_back_a_program_no_thread_has_begun():
    """wait() on a program still queued behind others drops it at once, for the caller to compile, rather
    than wait for the programs ahead of it; the threads then skip it."""
    ahead, gate, compiled = CompileAhead(workers=1), threading.Event(), []
    Lowered = _gated(gate, compiled)
    began = threading.Event()
    ahead.submit("busy", lambda: began.set() or Lowered("busy"))
    ahead.submit("queued", lambda: Lowered("queued"))
    ahead.submit("later", lambda: Lowered("later"))
    assert began.wait(30)  # the one thread has taken the first job, and waits at the gate
    start = time.perf_counter()
    ahead.wait("queued")
    assert time.perf_counter() - start < 0.5 and compiled == []
    gate.set()
    assert ahead.join(5)  # not wait("later"), which would take it back if no thread had begun it
    assert compiled == ["busy", "later"] and "queued" in ahead
    assert not ahead.submit("queued", lambda: Lowered("queued")), "a key taken back is not queued again"


def test_auto_workers():
    assert auto_workers("cpu") == 0
    assert 1 <= auto_workers("gpu") <= 8


def test_engine_compiles_the_windows_its_rows_grow_into_ahead():
    """A decode engine made from a sampler that compiles ahead queues, at each insert, the decode
    programs of the window its next decode takes and of the windows above, compiles each window
    once, and samples what generate does."""
    from spiral_jax.models import init_params
    from spiral_jax.sampling.engine import DecodeEngine, Request
    from tests.tiny_models import TINY

    cfg, sp = TINY.replace(max_position_embeddings=512), SamplingParams(max_new_tokens=48, temperature=0.7,
                                                                         stop_token_ids=frozenset({0, 1}))
    params = init_params(cfg, jax.random.key(1))
    decodes = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: decodes.append(1) if event.endswith("backend_compile_duration")
        and kw.get("fun_name") == "jit(decode)" else None)
    prompts = [[7 + i] * (3 + 9 * i) for i in range(6)]
    ref = Sampler(cfg, max_prompt_len=64, max_cache_len=128, compile_ahead=0).generate(params, prompts, sp, seed=2)
    sampler = Sampler(cfg, max_prompt_len=64, max_cache_len=128, compile_ahead=2)
    engine = DecodeEngine(sampler, sp, 2, min_steps=2)  # 2 slots: shapes no other test in this file uses
    used, wait = [], engine.ahead.wait
    engine.ahead.wait = lambda key: (used.append(key[1]) if len(key) == 2 else None) or wait(key)  # windows
    start, queue, out = len(decodes), [Request(p, 2, i) for i, p in enumerate(prompts)], {}
    while queue or engine.live:
        free = len(engine.free_slots())
        engine.insert(params, queue[:free])
        queue = queue[free:]
        out.update({f.request.row_id: f.tokens for f in engine.decode(params)})
    queued = [w for w in engine.windows if (engine._programs, w) in sampler.ahead]
    # An insert queues the window the next decode takes and every larger one.
    assert queued and min(queued) == min(used) and max(queued) == engine.windows[-1]
    sampler.ahead.join()
    assert len(decodes) - start == len(set(used) | set(queued)), "a window's decode program compiled twice"
    assert [out[i] for i in range(len(prompts))] == ref.tokens


def test_engine_compiles_smaller_inserts_ahead():
    """A decode engine's insert queues the inserts of fewer rows and of the next shorter block: a game's
    next turns in its slot (one row, ever shorter blocks) then run programs compiled ahead, once each,
    and sample what an engine that compiles nothing ahead does."""
    from spiral_jax.models import init_params
    from spiral_jax.sampling.engine import DecodeEngine, Request
    from tests.tiny_models import TINY

    cfg, sp = TINY.replace(max_position_embeddings=256), SamplingParams(max_new_tokens=8, temperature=0.7)
    params = init_params(cfg, jax.random.key(2))
    inserts = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: inserts.append(1) if event.endswith("backend_compile_duration")
        and kw.get("fun_name") == "jit(insert)" else None)

    def play(compile_ahead, slots):  # engines of the same shapes share their programs
        sampler = Sampler(cfg, max_prompt_len=64, max_cache_len=128, compile_ahead=compile_ahead)
        engine = DecodeEngine(sampler, sp, slots)
        queued = lambda: {(k, t) for k in (1, 2, 4, 8) for t in (16, 32, 64)  # noqa: E731
                          if (engine._programs, k, t) in engine.ahead}
        prompts = [[5 + i] * (20 + i) for i in range(3)]  # 3 rows of 32-token blocks: insert (4, 32)
        engine.insert(params, [Request(p, 1, i) for i, p in enumerate(prompts)])
        seen, out = [queued()], {}
        while engine.live:
            out.update({f.request.row_id: f for f in engine.decode(params)})
        compiled, game = [], out[1]
        for row_id, new in [(7, 17), (8, 3)]:  # the game's next turns: a 32-token block, then a 16-token one
            sampler.ahead.join()
            before = len(inserts)
            engine.insert(params, [Request(game.request.prompt + game.tokens + [9] * new, 1, row_id, slot=game.slot)])
            seen.append(queued())
            compiled.append(len(inserts) - before)
            while engine.live:
                (game,) = engine.decode(params)
        return seen, compiled, [out[i].tokens for i in range(3)] + [game.tokens]

    seen, compiled, tokens = play(2, 4)
    assert seen[0] == {(1, 32), (2, 32), (4, 16)}, "fewer rows, and the next shorter block"
    assert seen[1] - seen[0] == {(1, 16)} and seen[2] == seen[1]
    assert compiled == [0, 0], "a turn's insert compiled ahead was compiled again"
    plain_seen, plain_compiled, plain_tokens = play(0, 8)
    assert plain_seen == [set()] * 3 and plain_compiled == [1, 1] and plain_tokens == tokens


def test_a_sampler_job_not_begun_when_its_caller_drops_the_weights_holds_none_and_is_queued_again(qwen3):
    """A smaller batch bucket queued by a round's call holds the caller's parameters weakly: once the
    caller drops them (a rollout's cast copy at its end) they are freed, the job is withdrawn when a
    thread takes it, and a later call queues it again."""
    cfg, weights = qwen3
    sp = SamplingParams(max_new_tokens=4, greedy=True)
    sampler = Sampler(cfg, compile_ahead=1)
    gate, compiled = _busy(sampler.ahead)  # the sampler's jobs stay queued
    queued = [((rows, 32), 32 + 4, "greedy") for rows in (2, 1)]
    params = jax.tree.map(lambda x: x + 0, weights)  # a copy, as a rollout's cast is
    copy = weakref.ref(params["embed"])
    sampler.generate(params, PROMPTS, sp)
    assert all(key in sampler.ahead for key in queued)
    del params
    gc.collect()
    assert copy() is None, "a queued job holds the weights"
    gate.set()
    assert sampler.ahead.join(30) and compiled == ["busy"]
    assert not any(key in sampler.ahead for key in queued), "withdrawn, to be queued again"
    sampler.generate(weights, PROMPTS, sp)
    assert all(key in sampler.ahead for key in queued)
    assert sampler.ahead.join(60)
    before = compile_count()
    sampler.generate(weights, PROMPTS[2:], sp)  # the 20-token prompt keeps the prompt bucket
    assert compile_count() == before, "the program queued again was compiled ahead"


def test_an_engine_job_not_begun_when_it_forgets_holds_no_weights_and_is_queued_again():
    """A job no thread has begun when the engine forgets its cache (a rollout's end) is withdrawn: the
    queue holds neither the weights (a rollout casts its own copy) nor the cache into the training
    step, and the next insert queues the job again."""
    from spiral_jax.models import init_params
    from spiral_jax.sampling.engine import DecodeEngine, Request
    from tests.tiny_models import TINY

    cfg, sp = TINY.replace(max_position_embeddings=256), SamplingParams(max_new_tokens=8, temperature=0.7)
    sampler = Sampler(cfg, max_prompt_len=64, max_cache_len=128, compile_ahead=1)
    gate, compiled = _busy(sampler.ahead)  # the engine's jobs stay queued
    engine = DecodeEngine(sampler, sp, 4)  # the shapes of test_engine_compiles_smaller_inserts_ahead
    inserts = {(engine._programs, k, t) for k, t in [(1, 32), (2, 32), (4, 16)]}
    requests = [Request([5 + i] * (20 + i), 1, i) for i in range(3)]  # insert (4, 32)
    params = init_params(cfg, jax.random.key(2))
    weights = weakref.ref(params["embed"])
    engine.insert(params, requests)
    while engine.live:
        engine.decode(params)
    assert all(key in sampler.ahead for key in inserts)
    engine.forget()
    del params
    gc.collect()
    assert weights() is None, "a queued job holds the weights"
    gate.set()
    assert sampler.ahead.join(30) and compiled == ["busy"]
    assert not any(key in sampler.ahead for key in inserts), "withdrawn, to be queued again"
    engine.insert(init_params(cfg, jax.random.key(3)), requests)
    assert all(key in sampler.ahead for key in inserts)
    assert sampler.ahead.join(60)


def test_close_drops_what_has_not_started_and_idle_threads_end(monkeypatch):
    from spiral_jax.sampling import ahead as ahead_module

    monkeypatch.setattr(ahead_module, "_IDLE_SECONDS", 0.2)
    ahead, gate, compiled = CompileAhead(workers=1), threading.Event(), []
    Lowered = _gated(gate, compiled)
    began = threading.Event()
    ahead.submit("running", lambda: began.set() or Lowered("running"))
    ahead.submit("queued", lambda: Lowered("queued"))
    assert began.wait(30)  # the one thread has taken the first job
    threading.Timer(0.3, gate.set).start()
    ahead.close()
    assert compiled == ["running"] and not ahead.submit("later", lambda: Lowered("later"))
    ahead.wait("queued")  # dropped, and ended
    deadline = time.monotonic() + 5
    while ahead._threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not ahead._threads, "an idle thread did not end"


def test_a_sharded_sampler_runs_the_programs_compiled_ahead(qwen3):
    """On a mesh the prompts are placed on the data shards: the program compiled ahead for the smaller
    bucket is still the one the later call runs."""
    from spiral_jax.sharding import make_mesh

    cfg, params = qwen3
    sp = SamplingParams(max_new_tokens=4)
    sampler = Sampler(cfg, make_mesh(data=2, fsdp=2, tensor=2), compile_ahead=2)
    prompts = [[3 + i] * (4 + i % 9) for i in range(16)]
    first = sampler.generate(params, prompts, sp, seed=1)  # 16 rows: queues 8 and 4 (4 batch shards)
    plen, slots = sampler._buckets(prompts, sp)
    queued = [((rows, plen), slots, "plain") for rows in (8, 4)]
    assert all(key in sampler.ahead for key in queued) and ((2, plen), slots, "plain") not in sampler.ahead
    sampler.ahead.join()
    before = compile_count()
    eight = sampler.generate(params, prompts[:8], sp, seed=1)  # the longest prompt keeps the prompt bucket
    assert compile_count() == before, "the program compiled ahead was compiled again"
    assert eight.tokens == first.tokens[:8]
