"""The TPU decode kernels (`models.decode_attention`): run in Pallas' interpreter on CPU, the attention
computes what the XLA path does and never reads blocks past a row's slot, the cache write writes what
the scatter does, and the sampler and the decode engine take them where a TPU program would; compiled
for a TPU slice with libtpu, they run on each device's shard and the cache is never copied."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import cpu, decode_attention, fused_attention, transformer
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import init_params
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.engine import DecodeEngine, Request

LAYERS, ROWS, KV, HEADS, HEAD_DIM, SLOTS = 3, 4, 2, 8, 128, 512
# A Qwen3 with 128-wide heads (the kernel's lanes), small enough to sample with the interpreted kernels.
WIDE_HEADS = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=2,
                         num_heads=4, num_kv_heads=2, head_dim=128, qk_norm=True, tie_word_embeddings=True)


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    """Blocks of the fewest slots (128), so that the tests' windows have several and the online softmax
    and the skipping are exercised."""
    monkeypatch.setattr(decode_attention, "_BLOCK_BYTES", 1)


def _inputs(dtype, window, slots, seed=0):
    rng = np.random.default_rng(seed)
    cache = [jnp.asarray(rng.normal(size=(LAYERS, ROWS, KV, SLOTS, HEAD_DIM)), dtype) for _ in range(2)]
    q = jnp.asarray(rng.normal(size=(ROWS, 1, HEADS, HEAD_DIM)), dtype)
    kv_mask = jnp.asarray(rng.random((ROWS, window)) > 0.3)
    kv_mask = kv_mask.at[0, :40].set(False)  # a left-padded row: its first block is all padding
    kv_mask = kv_mask.at[jnp.arange(ROWS), slots].set(True)  # each query sees its own slot
    return q, *cache, kv_mask


@pytest.mark.parametrize("dtype, window, atol", [(jnp.float32, 384, 2e-6), (jnp.float32, 256, 2e-6),
                                                  (jnp.bfloat16, 384, 3e-2)])
def test_kernel_equals_the_xla_attention(dtype, window, atol):
    """Each layer of a scanned loop (the layer index traced), rows at different slots, a left-padded row,
    random gaps: the interpreted kernel against `transformer.attention` over the layer's window."""
    slots = jnp.array([60, 5, window - 1, 130])  # row 0's first block is mostly padding
    q, k, v, kv_mask = _inputs(dtype, window, slots)
    allowed = transformer._allowed(kv_mask, slots[:, None])
    assert decode_attention.block_slots(window, KV, HEAD_DIM, jnp.dtype(dtype).itemsize) < window  # several blocks

    def layer_out(_, layer):
        return None, decode_attention.decode_attention(q, k, v, layer, allowed[:, 0], slots, transformer.MASKED,
                                                       interpret=True)

    _, got = jax.lax.scan(layer_out, None, jnp.arange(LAYERS))
    for layer in range(LAYERS):
        want = transformer.attention(q, k[layer, :, :, :window], v[layer, :, :, :window], slots[:, None], kv_mask)
        np.testing.assert_allclose(np.asarray(got[layer], np.float32), np.asarray(want, np.float32), atol=atol)


def test_blocks_past_a_rows_slot_are_never_read():
    """NaN keys and values in every block after each row's own: the kernel skips those blocks, so the
    output stays finite and unchanged (the XLA path would read them and mask them only)."""
    window, slots = 384, jnp.array([10, 100, 200, 383])
    q, k, v, kv_mask = _inputs(jnp.float32, window, slots)
    allowed = transformer._allowed(kv_mask, slots[:, None])[:, 0]
    block = decode_attention.block_slots(window, KV, HEAD_DIM, 4)
    past = jnp.arange(SLOTS)[None, :] >= (slots[:, None] // block + 1) * block  # [rows, slots]
    poison = lambda c: jnp.where(past[None, :, None, :, None], jnp.nan, c)  # noqa: E731
    run = functools.partial(decode_attention.decode_attention, layer=jnp.int32(1), allowed=allowed, last_slots=slots,
                            masked=transformer.MASKED, interpret=True)
    clean = run(q, k_cache=k, v_cache=v)
    poisoned = run(q, k_cache=poison(k), v_cache=poison(v))
    assert bool(past[0, block]) and np.isfinite(np.asarray(poisoned)).all()
    np.testing.assert_array_equal(np.asarray(poisoned), np.asarray(clean))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_write_rows_writes_what_the_scatter_writes(dtype, monkeypatch):
    """Each row's key and value land at its own slot of the given layer (slot 383 at a tile's end, 400
    past the cache's end: dropped), in grid steps of 2 rows, and nothing else changes."""
    monkeypatch.setattr(decode_attention, "_WRITE_ROWS", 2)
    rng = np.random.default_rng(1)
    k_cache, v_cache = (jnp.asarray(rng.normal(size=(LAYERS, ROWS, KV, 384, HEAD_DIM)), dtype) for _ in range(2))
    k, v = (jnp.asarray(rng.normal(size=(ROWS, KV, HEAD_DIM)), jnp.float32) for _ in range(2))
    slots, rows = jnp.array([0, 17, 383, 400]), jnp.arange(ROWS)
    got = jax.jit(functools.partial(decode_attention.write_rows, interpret=True))(k_cache, v_cache, jnp.int32(1), k,
                                                                                  v, slots)
    for cache, new, out in zip((k_cache, v_cache), (k, v), got):
        want = cache.at[1, rows, :, slots].set(new.astype(dtype), mode="drop")
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(want, np.float32))


def test_where_the_kernels_apply():
    """TPU programs with Pallas attention ("auto", "splash"), or model.decode_attention="pallas", and
    128-wide heads take the kernels: the attention for one query a row over a window of whole blocks,
    the write for a cache of whole tiles (16 bf16 slots). Anything else keeps the XLA path."""
    q, k, v, kv_mask = _inputs(jnp.bfloat16, 384, jnp.array([1, 2, 3, 4]))
    allowed, q_slots = transformer._allowed(kv_mask, jnp.array([383])), jnp.array([383])

    def applies(implementation="auto", platform="tpu", q=q, allowed=allowed, decode="auto"):
        cfg = WIDE_HEADS.replace(attention=implementation, decode_attention=decode)
        with cpu.compiling_for(platform):
            out = jax.eval_shape(lambda: decode_attention.attend(cfg, None, transformer.CACHE_AXES, q, k,
                                                                 v, 0, allowed, transformer.MASKED))
        return out is not None

    def writes(implementation="auto", platform="tpu", slots=SLOTS):
        cfg = WIDE_HEADS.replace(attention=implementation)
        with cpu.compiling_for(platform):
            out = jax.eval_shape(lambda: decode_attention.write(cfg, None, transformer.CACHE_AXES,
                                                                k[:, :, :, :slots], v[:, :, :, :slots], 0,
                                                                q[:, 0, :KV], q[:, 0, :KV], q_slots))
        return out is not None

    assert writes() and not writes("xla") and not writes(platform="gpu") and not writes(slots=SLOTS - 8)
    assert applies() and applies("splash") and applies("xla", decode="pallas")
    assert not applies("xla") and not applies(decode="xla") and not applies(platform="gpu")
    assert not applies(platform="cpu")
    assert not applies(q=jnp.concatenate([q, q], axis=1))  # two queries a row: a prefill
    assert not applies(allowed=allowed[..., :320])  # 320 slots: no whole blocks of 128


@pytest.fixture(scope="module")
def wide_heads():
    return WIDE_HEADS, init_params(WIDE_HEADS, jax.random.key(0), std=0.2)


def _stacked(params):
    return dict(params, layers=jax.tree.map(lambda *layer: jnp.stack(layer), *params["layers"]))


def test_a_tpu_program_samples_with_the_kernel_as_with_xla(wide_heads, monkeypatch):
    """The sampler of a scanned model (the layer index traced) traced for a TPU, its Pallas kernels run
    in the interpreter: the decode steps run the kernel (a pallas_call in the decode loops), and the
    tokens and log-probs equal those of the XLA path ("xla")."""
    cfg, params = wide_heads
    cfg, params = cfg.replace(scan_layers=True), _stacked(params)
    monkeypatch.setattr(decode_attention, "decode_attention",
                        functools.partial(decode_attention.decode_attention, interpret=True))
    monkeypatch.setattr(fused_attention, "splash_attention",
                        functools.partial(fused_attention.splash_attention, interpret=True))
    # A prompt bucket of 128 and 130 new tokens: decode stages of 256 and 384 slots, whole blocks.
    prompts, sp = [[5, 6, 7, 8, 9], [1, 2, 3], list(range(10, 30))], SamplingParams(max_new_tokens=130)
    sampler_for = functools.partial(Sampler, min_prompt_bucket=128, first_window=128)
    with cpu.compiling_for("tpu"):
        sampler = sampler_for(cfg)
        got = sampler.generate(params, prompts, sp, seed=3)
        want = sampler_for(cfg.replace(attention="xla")).generate(params, prompts, sp, seed=3)
        args, static = sampler._arguments(params, prompts, sp, 0, None)
        (program,) = jax.make_jaxpr(functools.partial(sampler._program, **static))(*args).eqns
    decode_stages = [e for e in program.params["jaxpr"].eqns if e.primitive.name == "while"]
    assert len(decode_stages) == 2 and all("pallas_call" in str(e.params["body_jaxpr"]) for e in decode_stages)
    assert max(len(t) for t in got.tokens) > 128  # into the second stage
    assert got.tokens == want.tokens
    for a, b in zip(got.logprobs, want.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_programs_compiled_for_a_tpu_slice_run_the_kernels_on_each_shard():
    """The sampler and the decode engine of a scanned model compiled with libtpu for a v5p-8 slice (rows
    over data, heads over tensor): the kernels compile and run on each device's shard, and no trace
    leaks (the splash kernels, cached across programs, are built outside the trace that first asks
    for them)."""
    pytest.importorskip("libtpu")
    from spiral_jax import aot
    from spiral_jax.models.params import abstract_params
    from spiral_jax.sharding import make_mesh

    cfg = WIDE_HEADS.replace(scan_layers=True, compute_dtype="bfloat16")
    tgt = aot.target("v5p-8")
    mesh = make_mesh(data=2, fsdp=1, tensor=2, devices=tgt.devices)
    placed = lambda shapes, shardings: jax.tree.map(  # noqa: E731
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), shapes, shardings)

    def kernels(program, result_shapes):
        """The program's Pallas kernels whose results start with one of these (per-device) shapes."""
        return [line for line in program.as_text().splitlines() if 'custom_call_target="tpu_custom_call"' in line
                and line.split(" = ", 1)[1].lstrip("(").startswith(result_shapes)]

    # Mosaic takes 16-bit products at the default precision only (the tests' default is "highest").
    with aot.compiling(tgt), jax.default_matmul_precision("default"), jax.checking_leaks():
        samplers = {name: Sampler(cfg.replace(attention=name), mesh, max_prompt_len=128) for name in ("auto", "xla")}
        params = placed(abstract_params(cfg), samplers["auto"].params_sharding)
        lowered = {name: sampler.lower(params, [[1] * 100] * 4, SamplingParams(max_new_tokens=128))
                   for name, sampler in samplers.items()}
        program = lowered["auto"].compile()
        engine = DecodeEngine(samplers["auto"], SamplingParams(max_new_tokens=128), 8)
        decode = engine.lower(params)["decode"].compile()
    # Per device: the attention's result (2 of 4 rows, 2 of 4 query heads; the engine's 4 of 8 rows), the
    # engine's written cache (4 of 8 rows, 1 of 2 KV heads). The XLA path asks for no kernel at all.
    assert kernels(program, "bf16[2,1,2,128]") and "tpu_custom_call" not in lowered["xla"].as_text()
    assert "tpu_custom_call" in lowered["auto"].as_text()
    assert kernels(decode, "bf16[4,1,2,128]") and kernels(decode, "bf16[2,4,1,256,128]")


def test_a_tpu_decode_engine_samples_with_the_kernels_as_with_xla(wide_heads, monkeypatch):
    """The decode engine of a scanned model traced for a TPU, the kernels run in the interpreter: its rows
    each write at their own slot (`write_rows`) and attend over windows of 128 and 256 slots (the
    kernel) or 192 (the XLA path), with the tokens and log-probs of the XLA path."""
    cfg, params = wide_heads
    cfg, params = cfg.replace(scan_layers=True), _stacked(params)
    traced = {"attend": 0, "write": 0}

    def counted(name, kernel):
        def run(*args, **kwargs):
            traced[name] += 1
            return kernel(*args, **kwargs, interpret=True)
        return run

    monkeypatch.setattr(decode_attention, "decode_attention", counted("attend", decode_attention.decode_attention))
    monkeypatch.setattr(decode_attention, "write_rows", counted("write", decode_attention.write_rows))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 64, n).tolist() for n in (5, 90, 30, 12, 60, 7)]
    sp = SamplingParams(max_new_tokens=128, temperature=0.9)

    def sample(attention):
        engine = DecodeEngine(Sampler(cfg.replace(attention=attention), max_prompt_len=128), sp, 4)
        queue, out = [Request(p, 5, i) for i, p in enumerate(prompts)], {}
        while queue or engine.live:
            free = len(engine.free_slots())
            engine.insert(params, queue[:free])
            queue = queue[free:]
            out.update((f.request.row_id, f) for f in engine.decode(params))
        return engine, out

    with cpu.compiling_for("tpu"):
        engine, got = sample("auto")
        assert traced["attend"] and traced["write"]
        _, want = sample("xla")
    assert {128, 192, 256} <= set(engine.windows)
    for row in range(len(prompts)):
        assert got[row].tokens == want[row].tokens
        np.testing.assert_allclose(got[row].logprobs, want[row].logprobs, atol=1e-4)


def test_a_decode_engine_compiled_for_a_tpu_never_copies_its_cache():
    """The decode engine's decode call compiled with libtpu for one v5p chip: with the kernels, the cache
    stays in its layout from start to end: no copy of it, where XLA's scatter takes it in another
    layout, converted at the call's start and end (a whole cache or more of temporaries)."""
    pytest.importorskip("libtpu")
    from spiral_jax import aot
    from spiral_jax.models.params import abstract_params

    cfg = WIDE_HEADS.replace(scan_layers=True, compute_dtype="bfloat16")
    tgt = aot.target("v5p-8")
    device = jax.sharding.SingleDeviceSharding(tgt.devices[0])
    place = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), tree)  # noqa: E731

    def compiled(attention):
        with aot.compiling(tgt), jax.default_matmul_precision("default"):
            sampler = Sampler(cfg.replace(attention=attention), max_prompt_len=128)
            engine = DecodeEngine(sampler, SamplingParams(max_new_tokens=128), 8)
            program = engine.lower(place(abstract_params(cfg)))["decode"].compile()
        cache = (cfg.num_layers, 8, cfg.num_kv_heads, engine.cache_len, cfg.head_dim)
        copies = [line for line in program.as_text().splitlines() if " copy(" in line
                  and line.split(" = ", 1)[1].startswith("bf16[%s]" % ",".join(map(str, cache)))]
        return copies, program.memory_analysis().temp_size_in_bytes, np.prod(cache) * 2

    copies, temporaries, cache_bytes = compiled("auto")
    xla_copies, xla_temporaries, _ = compiled("xla")
    assert not copies and xla_copies
    assert xla_temporaries - temporaries >= cache_bytes  # at least a whole key cache
