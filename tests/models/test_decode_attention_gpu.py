"""The GPU decode kernel (`models.decode_attention_gpu`), run in Pallas' interpreter on CPU: it computes
what the XLA path does over any window and split, never reads a slot past a row's own, and the sampler
and the decode engine traced for a GPU take it where model.decode_attention="pallas" asks, with the
tokens of XLA's attention."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import cpu, decode_attention, decode_attention_gpu as gpu, transformer
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import init_params
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.engine import DecodeEngine, Request

LAYERS, ROWS, KV, HEAD_DIM, SLOTS = 3, 4, 2, 32, 320
TINY = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True)


def _inputs(heads, window, slots, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    cache = [jnp.asarray(rng.normal(size=(LAYERS, ROWS, KV, SLOTS, HEAD_DIM)), dtype) for _ in range(2)]
    q = jnp.asarray(rng.normal(size=(ROWS, 1, heads, HEAD_DIM)), dtype)
    kv_mask = jnp.asarray(rng.random((ROWS, window)) > 0.3)
    kv_mask = kv_mask.at[0, :70].set(False)  # a left-padded row: its first block is all padding
    kv_mask = kv_mask.at[jnp.arange(ROWS), slots].set(True)  # each query sees its own slot
    return q, *cache, kv_mask


@pytest.mark.parametrize("heads, window, programs, most", [(2, 300, 256, 10**6), (8, 300, 1, 10**6),
                                                           (8, 300, 1, 128), (14, 192, 16, 10**6), (4, 64, 256, 64)])
def test_kernel_equals_the_xla_attention(heads, window, programs, most, monkeypatch):
    """Query groups of 1, 4 and 7 heads (padded to 16 rows), windows of whole and partial blocks, one
    split a row or several (by the programs wanted, or by the slots a program may walk), rows at
    different slots, a left-padded row: each layer (its index traced) against `transformer.attention`
    over the layer's window."""
    monkeypatch.setattr(gpu, "_PROGRAMS", programs)
    monkeypatch.setattr(gpu, "_SPLIT_SLOTS", most)
    slots = jnp.array([80, 5, window - 1, min(130, window - 2)])
    q, k, v, kv_mask = _inputs(heads, window, slots)
    allowed = transformer._allowed(kv_mask, slots[:, None])[:, 0]

    def layer_out(_, layer):
        return None, gpu.decode_attention(q, k, v, layer, allowed, slots, transformer.MASKED, interpret=True)

    _, got = jax.lax.scan(layer_out, None, jnp.arange(LAYERS))
    for layer in range(LAYERS):
        want = transformer.attention(q, k[layer, :, :, :window], v[layer, :, :, :window], slots[:, None], kv_mask)
        np.testing.assert_allclose(np.asarray(got[layer]), np.asarray(want), atol=2e-6)


def test_splits_cover_the_window_in_whole_blocks_and_spread_long_rows():
    for rows, kv, window, most in [(1, 8, 6144, 1024), (16, 8, 6144, 1024), (16, 8, 6144, 4096), (64, 8, 100, 1024),
                                   (1, 1, 64, 1024), (3, 2, 1000, 128), (32, 8, 6144, 10**6)]:
        splits, chunk = gpu._splits(rows, kv, window, most)
        blocks = -(-window // gpu._BLOCK)
        assert chunk % gpu._BLOCK == 0 and (splits - 1) * chunk < window <= splits * chunk
        assert chunk <= max(most, gpu._BLOCK)  # a long row's slots spread over programs
        assert rows * kv * splits >= min(gpu._PROGRAMS, rows * kv * blocks)  # enough programs to fill a GPU
    assert gpu._splits(32, 8, 6144, 10**6) == (1, 6144)  # 256 programs already: one split a row


def test_slots_past_a_rows_own_are_never_read():
    """NaN keys and values in every slot after each row's query slot: the kernel's loads stop at the
    row's end, so the output stays finite and unchanged (XLA's attention reads them, masked, and a NaN
    value times a zero probability is NaN)."""
    window, slots = 300, jnp.array([10, 100, 200, 299])
    q, k, v, kv_mask = _inputs(4, window, slots)
    allowed = transformer._allowed(kv_mask, slots[:, None])[:, 0]
    past = jnp.arange(SLOTS)[None, :] > slots[:, None]  # [rows, slots]
    poison = lambda c: jnp.where(past[None, :, None, :, None], jnp.nan, c)  # noqa: E731
    run = functools.partial(gpu.decode_attention, layer=jnp.int32(1), allowed=allowed, last_slots=slots,
                            masked=transformer.MASKED, interpret=True)
    clean = run(q, k_cache=k, v_cache=v)
    poisoned = run(q, k_cache=poison(k), v_cache=poison(v))
    assert np.isfinite(np.asarray(poisoned)).all()
    np.testing.assert_array_equal(np.asarray(poisoned), np.asarray(clean))
    xla = transformer.attention(q, poison(k)[1, :, :, :window], poison(v)[1, :, :, :window], slots[:, None], kv_mask)
    assert not np.isfinite(np.asarray(xla)).all()


def test_where_the_gpu_kernel_applies():
    """GPU programs take it where model.decode_attention="pallas" asks, for 16- or 32-bit caches and
    power-of-two heads; "auto" and "xla" keep XLA's attention on a GPU, and a CPU program never takes
    it. It never writes the cache (XLA:GPU scatters in place)."""
    cfg = TINY.replace(decode_attention="pallas")

    def which(cfg=cfg, platform="gpu", dtype=jnp.bfloat16, head_dim=128, group=4):
        with cpu.compiling_for(platform):
            return decode_attention.kernel(cfg, None, dtype, head_dim, group)

    assert which() == "gpu" and which(dtype=jnp.float32) == "gpu" and which(head_dim=64, group=7) == "gpu"
    assert which(cfg=TINY) is None and which(cfg=TINY.replace(decode_attention="xla")) is None
    assert which(head_dim=96) is None and which(dtype=jnp.int8) is None and which(platform="cpu") is None
    assert which(cfg=TINY, platform="tpu") == "tpu" and which(cfg=cfg.replace(attention="xla"), platform="tpu") == "tpu"
    assert which(cfg=TINY.replace(attention="xla"), platform="tpu") is None
    with pytest.raises(ValueError, match="decode_attention='triton'.*pallas"):
        TINY.replace(decode_attention="triton")
    k = jnp.zeros((1, 2, 2, 32, 16))
    with cpu.compiling_for("gpu"):
        assert decode_attention.write(cfg, None, transformer.CACHE_AXES, k, k, 0, k[0, :, :, 0], k[0, :, :, 0],
                                      jnp.zeros(2, jnp.int32)) is None


@pytest.fixture
def interpreted(monkeypatch):
    """The GPU kernel in Pallas' interpreter, counting the decode steps that trace it."""
    traced = []

    def run(*args, **kwargs):
        traced.append(1)
        return gpu_kernel(*args, **kwargs, interpret=True)

    gpu_kernel = gpu.decode_attention
    monkeypatch.setattr(gpu, "decode_attention", run)
    return traced


@pytest.fixture(scope="module")
def tiny():
    return init_params(TINY, jax.random.key(0), std=0.2)


def test_a_gpu_sampler_samples_with_the_kernel_as_with_xla(tiny, interpreted):
    """The sampler traced for a GPU (layers unrolled in its decode steps): with "pallas" its decode steps
    run the kernel, and the tokens and log-probs equal XLA's."""
    prompts, sp = [[5, 6, 7, 8, 9], [1, 2, 3], list(range(10, 30))], SamplingParams(max_new_tokens=70)
    with cpu.compiling_for("gpu"):
        got = Sampler(TINY.replace(decode_attention="pallas"), first_window=64).generate(tiny, prompts, sp, seed=3)
        assert interpreted
        want = Sampler(TINY, first_window=64).generate(tiny, prompts, sp, seed=3)
    assert max(len(t) for t in got.tokens) > 40
    assert got.tokens == want.tokens
    for a, b in zip(got.logprobs, want.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_a_gpu_decode_engine_samples_with_the_kernel_as_with_xla(tiny, interpreted):
    """The decode engine traced for a GPU, its rows at their own slots: the kernel's tokens and log-probs
    are XLA's."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 64, n).tolist() for n in (5, 90, 30, 12, 60, 7)]
    sp = SamplingParams(max_new_tokens=60, temperature=0.9)

    def sample(cfg):
        engine = DecodeEngine(Sampler(cfg, max_prompt_len=128), sp, 4)
        queue, out = [Request(p, 5, i) for i, p in enumerate(prompts)], {}
        while queue or engine.live:
            free = len(engine.free_slots())
            engine.insert(tiny, queue[:free])
            queue = queue[free:]
            out.update((f.request.row_id, f) for f in engine.decode(tiny))
        return out

    with cpu.compiling_for("gpu"):
        got = sample(TINY.replace(decode_attention="pallas"))
        assert interpreted
        want = sample(TINY)
    for row in range(len(prompts)):
        assert got[row].tokens == want[row].tokens
        np.testing.assert_allclose(got[row].logprobs, want[row].logprobs, atol=1e-4)


def test_on_a_mesh_the_kernel_runs_on_each_devices_shard(tiny, interpreted, monkeypatch):
    """Rows over data, heads over tensor (one KV head a device): the sampler runs the kernel on each
    device's shard (it has no partitioning rule), with XLA's tokens. The mesh's devices are CPUs, so
    the choice of kernel is the GPU's by hand (`kernel` reads the platform from the mesh)."""
    from spiral_jax.sharding import make_mesh

    monkeypatch.setattr(decode_attention, "kernel", lambda cfg, *_: "gpu" if cfg.decode_attention == "pallas" else None)
    mesh = make_mesh(data=2, fsdp=1, tensor=2, devices=jax.devices()[:4])
    prompts, sp = [[5, 6, 7, 8, 9], [1, 2, 3], list(range(10, 30)), [4, 4]], SamplingParams(max_new_tokens=40)
    with cpu.compiling_for("gpu"):
        got = Sampler(TINY.replace(decode_attention="pallas"), mesh).generate(tiny, prompts, sp, seed=1)
        assert interpreted
        want = Sampler(TINY, mesh).generate(tiny, prompts, sp, seed=1)
    assert got.tokens == want.tokens
    for a, b in zip(got.logprobs, want.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_a_finished_row_that_sees_its_first_slot_only_reads_no_further(interpreted):
    """`attend` stops each row at the last slot it sees, not at its query slot: a finished row, masked to
    its first slot (`sampling.finish.finished_sees_first`), reads one block, and NaN past it changes
    nothing; its output is that slot's value."""
    from spiral_jax.sampling.finish import finished_sees_first

    window, slots = 300, jnp.array([250, 250, 250, 250])
    q, k, v, kv_mask = _inputs(4, window, slots)
    kv_mask = finished_sees_first(kv_mask, jnp.array([False, True, False, False]))
    poison = jnp.arange(SLOTS) >= gpu._BLOCK
    k, v = (c.at[:, 1].set(jnp.where(poison[None, None, :, None], jnp.nan, c[:, 1])) for c in (k, v))
    cfg = TINY.replace(decode_attention="pallas", num_heads=4, head_dim=HEAD_DIM)
    with cpu.compiling_for("gpu"):
        out = decode_attention.attend(cfg, None, transformer.CACHE_AXES, q, k, v, 2,
                                      transformer._allowed(kv_mask, slots[:, None]), transformer.MASKED)
    assert interpreted and np.isfinite(np.asarray(out)).all()
    np.testing.assert_allclose(np.asarray(out[1, 0]).reshape(KV, 2, HEAD_DIM),
                               np.broadcast_to(np.asarray(v[2, 1, :, None, 0]), (KV, 2, HEAD_DIM)), atol=1e-6)
    want = transformer.attention(q, k[2, :, :, :window], v[2, :, :, :window], slots[:, None], kv_mask)
    np.testing.assert_allclose(np.asarray(out)[[0, 2, 3]], np.asarray(want)[[0, 2, 3]], atol=2e-6)
