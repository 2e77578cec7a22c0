"""The TPU decode-attention kernel (`models.decode_attention`): run in Pallas' interpreter on CPU, it
computes what the XLA path does, never reads blocks past a row's slot, and the sampler takes it where
a TPU program would; compiled for a TPU slice with libtpu, its decode loops copy no cache window."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import cpu, decode_attention, fused_attention, transformer
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import init_params
from spiral_jax.sampling import Sampler, SamplingParams

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
    run = functools.partial(decode_attention.decode_attention, layer=jnp.int32(1), allowed=allowed, q_slots=slots,
                            masked=transformer.MASKED, interpret=True)
    clean = run(q, k_cache=k, v_cache=v)
    poisoned = run(q, k_cache=poison(k), v_cache=poison(v))
    assert bool(past[0, block]) and np.isfinite(np.asarray(poisoned)).all()
    np.testing.assert_array_equal(np.asarray(poisoned), np.asarray(clean))


def test_where_the_kernel_applies():
    """TPU programs with Pallas attention ("auto", "splash"), 128-wide heads, one query a row and a window
    of whole blocks take the kernel; anything else keeps the XLA path."""
    q, k, v, kv_mask = _inputs(jnp.bfloat16, 384, jnp.array([1, 2, 3, 4]))
    allowed, q_slots = transformer._allowed(kv_mask, jnp.array([383])), jnp.array([383])

    def applies(implementation="auto", platform="tpu", q=q, allowed=allowed):
        with cpu.compiling_for(platform):
            out = jax.eval_shape(lambda: decode_attention.on_tpu(implementation, None, transformer.CACHE_AXES, q, k,
                                                                 v, 0, allowed, q_slots, transformer.MASKED))
        return out is not None

    assert applies() and applies("splash")
    assert not applies("xla") and not applies(platform="gpu") and not applies(platform="cpu")
    assert not applies(q=jnp.concatenate([q, q], axis=1))  # two queries a row: a prefill
    assert not applies(allowed=allowed[..., :320])  # 320 slots: no whole blocks of 128


@pytest.fixture(scope="module")
def wide_heads():
    return WIDE_HEADS, init_params(WIDE_HEADS, jax.random.key(0), std=0.2)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_a_tpu_program_samples_with_the_kernel_as_with_xla(wide_heads, scan_layers, monkeypatch):
    """The sampler traced for a TPU, its Pallas kernels run in the interpreter: the decode steps run the
    kernel (a pallas_call in the decode loops), and the tokens and log-probs equal those of the XLA
    path ("xla")."""
    cfg, params = wide_heads
    if scan_layers:
        params = dict(params, layers=jax.tree.map(lambda *layer: jnp.stack(layer), *params["layers"]))
    cfg = cfg.replace(scan_layers=scan_layers)
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


def test_a_sampler_compiled_for_a_tpu_slice_runs_the_kernel_on_each_shard():
    """The sampler of a scanned model compiled with libtpu for a v5p-8 slice (rows over data, heads over
    tensor): the kernel compiles, the decode loop runs it on each device's shard, and no trace leaks (the
    splash kernels, cached across programs, are built outside the trace that first asks for them)."""
    pytest.importorskip("libtpu")
    from spiral_jax import aot
    from spiral_jax.models.params import abstract_params
    from spiral_jax.sharding import make_mesh

    cfg = WIDE_HEADS.replace(scan_layers=True, compute_dtype="bfloat16")
    mesh = make_mesh(data=2, fsdp=1, tensor=2, devices=aot.tpu_devices("v5p-8"))

    def decode_hlo(attention):
        # Mosaic takes 16-bit products at the default precision only (the tests' default is "highest").
        with cpu.compiling_for("tpu"), jax.default_matmul_precision("default"), jax.checking_leaks():
            sampler = Sampler(cfg.replace(attention=attention), mesh)
            params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  abstract_params(cfg), sampler.params_sharding)
            hlo = sampler.lower(params, [[1] * 100] * 4, SamplingParams(max_new_tokens=128)).compile().as_text()
        # The kernel's result on one device: 2 of the 4 rows, 2 of the 4 query heads.
        return [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line
                and line.split(" = ", 1)[1].startswith("bf16[2,1,2,128]")]

    assert decode_hlo("auto") and not decode_hlo("xla")
