"""The sampler: exact greedy decoding, exact log-probs, correct sampling statistics, static shapes."""
import functools

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from spiral_jax.compilation import compile_count
from spiral_jax.models import KVCache, cpu, cpu_kernels, decoder, forward, load_pretrained
from spiral_jax.sampling import Sampler, SamplingParams, sample_token
from spiral_jax.models import transformer
from spiral_jax.sampling import logits as logits_module
from spiral_jax.sampling import sampler as sampler_module
from spiral_jax.sampling.scoring import sequence_logprobs
from spiral_jax.sharding import make_mesh

PROMPTS = [[5, 6, 7, 8, 9], [1, 2, 3], list(range(10, 47)), [100] * 17]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    from tests.tiny_models import make_hf_model

    path = tmp_path_factory.mktemp("qwen3")
    make_hf_model("qwen3", path)
    return load_pretrained(path)


def test_greedy_matches_transformers_generate(hf_model, layouts):
    _, path, model = hf_model
    cfg, params = load_pretrained(path)
    out = Sampler(cfg).generate(params, PROMPTS, SamplingParams(max_new_tokens=40, greedy=True))
    for prompt, tokens, reason in zip(PROMPTS, out.tokens, out.finish_reasons):
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        assert tokens == ref[0, len(prompt):].tolist()
        assert reason == "length"


def test_layouts_fixture_switches_code_paths(qwen3, layouts, monkeypatch):
    """Only the CPU layouts decode with the CPU attention kernel: the `layouts` fixture reaches the model."""
    cfg, params = qwen3
    calls = []
    spy = functools.partial(lambda f, *a, **kw: calls.append(1) or f(*a, **kw), cpu_kernels.decode_attention)
    monkeypatch.setattr(cpu_kernels, "decode_attention", spy)
    Sampler(cfg).generate(params, PROMPTS[:1], SamplingParams(max_new_tokens=3, greedy=True))
    assert bool(calls) == (layouts == "cpu")


def test_cpu_kernels_off_gives_the_same_output(qwen3, monkeypatch):
    """XLA's own decode step (where the kernels cannot be built) samples the same tokens with the same
    log-probs, to float rounding, as the one with the CPU kernels."""
    cfg, params = qwen3
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]  # 16 rows: the matmul kernel's batch too
    sp = SamplingParams(max_new_tokens=12)
    on = Sampler(cfg).generate(params, prompts, sp, seed=5)
    monkeypatch.setattr(cpu_kernels, "available", lambda: False)
    off = Sampler(cfg).generate(params, prompts, sp, seed=5)
    for a, b, la, lb in zip(on.tokens, off.tokens, on.logprobs, off.logprobs):
        assert a == b
        np.testing.assert_allclose(la, lb, atol=1e-5)


@functools.partial(jax.jit, static_argnums=1)
def _forward(params, cfg, ids):
    return forward(params, cfg, ids)


def _teacher_forced_logits(params, cfg, prompt, tokens):
    ids = np.asarray([prompt + tokens])
    logits = np.asarray(_forward(params, cfg, ids))[0]
    return logits[len(prompt) - 1:-1]  # logits that predicted each generated token


def test_logprobs_equal_teacher_forced(qwen3):
    cfg, params = qwen3
    out = Sampler(cfg).generate(params, PROMPTS, SamplingParams(max_new_tokens=24), seed=3)
    for prompt, tokens, lp, raw in zip(PROMPTS, out.tokens, out.logprobs, out.raw_logprobs):
        logits = _teacher_forced_logits(params, cfg, prompt, tokens)
        expected = jax.nn.log_softmax(logits, -1)[np.arange(len(tokens)), tokens]
        np.testing.assert_allclose(lp, expected, atol=1e-5)
        np.testing.assert_allclose(raw, expected, atol=1e-5)


def _truncated_logprobs(logits, temperature, top_k, top_p):
    """Reference: log of the renormalised top-k / top-p distribution at `temperature` (numpy)."""
    out = []
    for row in logits / temperature:
        order = np.argsort(-row, kind="stable")
        keep = np.zeros(row.shape, bool)
        k = top_k or len(row)
        probs = np.exp(row[order[:k]] - row[order[0]])
        probs /= probs.sum()
        mass = 0.0
        for idx, p in zip(order[:k], probs):
            if mass >= top_p:
                break
            keep[idx] = True
            mass += p
        z = np.where(keep, row, -np.inf)
        out.append(z - np.logaddexp.reduce(z[keep]))
    return np.asarray(out)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 1.0), (1.0, 20, 1.0), (1.3, 0, 0.8),
                                                      (0.6, 50, 0.95)])
def test_truncated_logprobs(qwen3, temperature, top_k, top_p):
    cfg, params = qwen3
    sp = SamplingParams(max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p)
    out = Sampler(cfg).generate(params, PROMPTS[:2], sp, seed=1)
    for prompt, tokens, lp, raw in zip(PROMPTS, out.tokens, out.logprobs, out.raw_logprobs):
        logits = _teacher_forced_logits(params, cfg, prompt, tokens)
        ref = _truncated_logprobs(logits, temperature, top_k, top_p)[np.arange(len(tokens)), tokens]
        assert np.all(np.isfinite(ref)), "sampled a token outside the truncated support"
        np.testing.assert_allclose(lp, ref, atol=1e-5)
        np.testing.assert_allclose(raw, jax.nn.log_softmax(logits, -1)[np.arange(len(tokens)), tokens],
                                   atol=1e-5)


# Chi-square critical values at p = 0.001, by degrees of freedom (support size - 1).
CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (2.0, 0, 1.0),
                                                      (1.0, 3, 1.0), (1.0, 0, 0.7)])
def test_sampling_frequencies_match_target(temperature, top_k, top_p):
    logits = jnp.asarray([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    n = 40000
    keys = jax.random.split(jax.random.key(0), n)
    draw = jax.jit(jax.vmap(lambda k: sample_token(
        logits, k[None], temperature, jnp.int32(top_k), jnp.float32(top_p), 
        mode=SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p).mode)[0][0]))
    counts = np.bincount(np.asarray(draw(keys)), minlength=8)
    target = np.exp(_truncated_logprobs(np.asarray(logits), temperature, top_k, top_p)[0])
    support = target > 0
    assert counts[~support].sum() == 0, "sampled outside the truncated support"
    expected = n * target[support]
    chi2 = ((counts[support] - expected) ** 2 / expected).sum()
    assert chi2 < CHI2_CRIT[int(support.sum()) - 1], (counts, expected)


def test_plain_path_equals_general_path_at_temperature_one():
    """The plain mode (temperature 1, no truncation: one exp pass) draws the same tokens and log-probs
    as the tempered one at temperature 1."""
    logits = jax.random.normal(jax.random.key(1), (16, 1000)) * 3
    keys = jax.random.split(jax.random.key(2), 16)
    args = (logits, keys, jnp.float32(1.0), jnp.int32(0), jnp.float32(1.0))
    general = sample_token(*args, mode="tempered")
    plain = sample_token(*args, mode="plain")
    np.testing.assert_array_equal(general[0], plain[0])
    np.testing.assert_allclose(general[1], plain[1], atol=1e-6)
    np.testing.assert_allclose(general[2], plain[2], atol=1e-6)
    np.testing.assert_allclose(plain[1], jax.nn.log_softmax(logits)[jnp.arange(16), plain[0]], atol=1e-5)


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_a_draw_of_a_zero_probability_token_steps_back_to_the_most_likely(platform, monkeypatch):
    """Rounding can land the inverse CDF on a masked token; that row takes its most likely token
    instead. On CPU a conditional runs that pass only when it is needed; for a GPU, where a conditional
    is a device-to-host sync every decode step, the program has none and always runs it."""
    real = logits_module.inverse_cdf

    def lands_on_a_masked_token_in_row_0(*args):
        token, mass, kept = real(*args)
        return token, mass, kept.at[0].set(False)

    monkeypatch.setattr(logits_module, "inverse_cdf", lands_on_a_masked_token_in_row_0)
    scores = jax.random.normal(jax.random.key(5), (4, 300)) * 3
    args = (scores, jax.random.split(jax.random.key(6), 4), jnp.float32(0.8), jnp.int32(0), jnp.float32(1.0))
    sample = functools.partial(sample_token, mode="tempered", vocab_major=False)
    with cpu.compiling_for(platform):
        text = jax.jit(sample).lower(*args).as_text()
        tokens = jax.jit(sample)(*args)[0]
    monkeypatch.setattr(logits_module, "inverse_cdf", real)
    drawn = jax.jit(sample)(*args)[0]
    assert ("stablehlo.case" in text or "stablehlo.if" in text) == (platform == "cpu")
    assert int(tokens[0]) == int(jnp.argmax(scores[0]))
    np.testing.assert_array_equal(tokens[1:], drawn[1:])


@pytest.mark.parametrize("ax", [0, 1])
def test_a_draw_of_zero_picks_the_first_token_with_mass(ax):
    """u = 0 (one draw in 2^24) takes the first token of positive probability, in the first block and
    past whole blocks of masked tokens; it never lands on a masked token."""
    scores = jnp.full((2, 300), -jnp.inf).at[0, 3:].set(0.5).at[1, 200:].set(1.0).at[1, 250].set(2.0)
    scores = scores if ax == 1 else scores.T
    top = jnp.max(scores, axis=ax, keepdims=True)
    u = jnp.zeros_like(top)
    token, _, kept = logits_module.inverse_cdf(scores, top, u, ax)
    assert token.reshape(-1).tolist() == [3, 200] and bool(jnp.all(kept))


def _rows_to_truncate():
    """Rows of 1000 logits from peaked to flat, one with ties across its top 300, and per-row settings
    that cover no top-k, top-k within and past 16 candidates and past the vocabulary, top-p 1."""
    rng = np.random.default_rng(0)
    scales = np.array([0.05, 0.5, 3.0, 10.0, 1.0, 0.01, 2.0, 0.3])[:, None]
    logits = jnp.asarray(rng.normal(size=(8, 1000)) * scales, jnp.float32).at[5, :300].set(2.0)
    top_k = jnp.array([0, 5, 16, 17, 300, 0, 2000, 0], jnp.int32)
    top_p = jnp.array([0.95, 1.0, 0.9, 0.5, 0.99, 0.7, 0.5, 1.0], jnp.float32)
    return logits, top_k, top_p


def _kept_by_sorting(logits, top_k, top_p):
    """Reference, ties kept (numpy, float64): sort each row, keep its top-k values while the mass
    before each (of the top-k's) is below top_p, then every value at least the last one kept."""
    kept = []
    for row, k, p in zip(np.asarray(logits, np.float64), np.broadcast_to(top_k, len(logits)),
                         np.broadcast_to(top_p, len(logits))):
        desc = np.sort(row)[::-1][:k if k > 0 else None]
        probs = np.exp(desc - desc[0]) / np.exp(desc - desc[0]).sum()
        n = np.sum((np.cumsum(probs) - probs < p) | (p >= 1))
        kept.append(row >= desc[n - 1])
    return np.asarray(kept)


@pytest.mark.parametrize("ax", [1, 0])
def test_truncation_among_candidates_or_by_halving_cuts_where_a_sort_does(ax):
    """The cut found among each row's 16 largest values, then by halving where the nucleus or the top-k
    reaches past those, and the cut found by halving alone, keep what sorting the vocabulary keeps, in
    either layout: ties with the cut included, and against the position-ordered reference too."""
    logits, top_k, top_p = _rows_to_truncate()
    x = logits if ax == 1 else logits.T
    k, p = jnp.expand_dims(top_k, ax), jnp.expand_dims(top_p, ax)
    among = jax.jit(functools.partial(logits_module.truncate, ax=ax, candidates=16))(x, k, p)
    halved = jax.jit(functools.partial(logits_module.truncate, ax=ax, candidates=0))(x, k, p)
    kept = np.isfinite(np.asarray(among if ax == 1 else among.T))
    np.testing.assert_array_equal(kept, np.isfinite(np.asarray(halved if ax == 1 else halved.T)))
    np.testing.assert_array_equal(kept, _kept_by_sorting(logits, np.asarray(top_k), np.asarray(top_p)))
    n = kept.sum(1)  # every way was taken: among 16; by halving, with top-k (row 4) and without
    assert n[[1, 2]].max() <= 16 and top_k[3] == 17 and 16 < n[4] < 300 and n[[0, 6]].min() > 16
    assert kept[7].all() and kept[5, :300].all()  # top-p 1 cuts nothing; ties with the cut stay
    for row in (0, 1, 2, 3, 4, 6, 7):  # the reference breaks ties by position; row 5 has ties
        ref = _truncated_logprobs(np.asarray(logits[row:row + 1]), 1.0, int(top_k[row]), float(top_p[row]))
        np.testing.assert_array_equal(kept[row], np.isfinite(ref[0]), err_msg=f"row {row}")


@pytest.mark.parametrize("seed", range(3))
def test_halving_finds_the_sorts_cut_on_ties_zeros_and_masked_values(seed):
    """Rows drawn from few distinct values (ties everywhere, 0.0 and -0.0 among them) and with masked
    (-inf) entries, at every top-k and top-p: halving keeps what the sort keeps."""
    rng = np.random.default_rng(seed)
    values = np.array([-np.inf, -3.5, -1.0, -0.0, 0.0, 0.25, 1.0, 2.0, 2.5, 4.0], np.float32)
    logits = jnp.asarray(values[rng.integers(0, len(values), size=(24, 200))]).at[:, 0].set(4.0)
    top_k = jnp.asarray(rng.choice([0, 1, 3, 17, 150, 199, 200], size=24), jnp.int32)
    top_p = jnp.asarray(rng.choice([0.05, 0.3, 0.6, 0.9, 0.999, 1.0], size=24), jnp.float32)
    cut = logits_module.truncate(logits, top_k[:, None], top_p[:, None], 1, candidates=0)
    finite = np.isfinite(logits)  # a masked value stays -inf, kept or not
    np.testing.assert_array_equal(np.isfinite(cut)[finite],
                                  _kept_by_sorting(logits, np.asarray(top_k), np.asarray(top_p))[finite])


@pytest.mark.parametrize("platform", ["cpu", "tpu", "gpu"])
def test_truncation_never_sorts_the_vocabulary(platform):
    """On CPU and TPU a step takes each row's largest values (lax.top_k) and halves only under a
    conditional; XLA:CPU runs that top_k as a partial sort (its TopK), not a full one. A GPU program,
    where a conditional syncs with the host, halves every step and has no conditional. None sorts."""
    logits, top_k, top_p = _rows_to_truncate()
    cut = jax.jit(functools.partial(logits_module.truncate, ax=1))
    with cpu.compiling_for(platform):
        text = cut.lower(logits, top_k[:, None], top_p[:, None]).as_text()
    has_conditional = "stablehlo.case" in text or "stablehlo.if" in text
    assert has_conditional == (platform != "gpu") and "stablehlo.sort" not in text
    assert ("top_k" in text) == (platform != "gpu")
    if platform == "cpu":
        compiled = cut.lower(logits, top_k[:, None], top_p[:, None]).compile().as_text()
        assert compiled.count('custom_call_target="TopK"') == 1 and " sort(" not in compiled


@pytest.mark.parametrize("mode", ["greedy", "plain", "tempered", "truncated"])
def test_vocab_major_and_row_major_sampling_agree(mode):
    """Large CPU batches are sampled vocabulary-major, small ones row-major: same tokens, same log-probs."""
    logits = jax.random.normal(jax.random.key(3), (16, 1000)) * 3
    keys = jax.random.split(jax.random.key(4), 16)
    args = (logits, keys, jnp.float32(1.0 if mode == "plain" else 0.8), jnp.int32(40), jnp.float32(0.9))
    out = {}
    for vocab_major in (True, False):
        out[vocab_major] = jax.jit(functools.partial(sample_token, mode=mode, vocab_major=vocab_major))(*args)
    np.testing.assert_array_equal(out[True][0], out[False][0])
    np.testing.assert_allclose(out[True][1], out[False][1], atol=1e-5)
    np.testing.assert_allclose(out[True][2], out[False][2], atol=1e-5)


def test_row_is_independent_of_batch(qwen3):
    cfg, params = qwen3
    sampler = Sampler(cfg)
    sp = SamplingParams(max_new_tokens=20, temperature=1.0)
    alone = sampler.generate(params, [PROMPTS[2]], sp, seed=7, row_ids=[2])
    batch = sampler.generate(params, PROMPTS + PROMPTS, sp, seed=7, row_ids=range(8))
    assert alone.tokens[0] == batch.tokens[2]
    assert batch.tokens[2] != batch.tokens[6], "different row ids should sample differently"


def _table_copy_shape(sampler, params, prompts, sp) -> tuple | None:
    """Shape of the [D, V] table copy the sampling program for these prompts takes, or None."""
    table = sampler.lower(params, prompts, sp).args_info[0][1]
    return None if table is None else tuple(table.shape)


def test_one_row_decodes_with_a_transposed_table(qwen3, layouts):
    """A one-row call on CPU multiplies a [D, V] copy of the table, with the same tokens and log-probs
    as the same row decoded in a batch (which multiplies the stored table)."""
    cfg, params = qwen3
    sampler = Sampler(cfg)
    for sp in (SamplingParams(max_new_tokens=24, greedy=True), SamplingParams(max_new_tokens=24, temperature=1.0)):
        alone = sampler.generate(params, [PROMPTS[2]], sp, seed=4, row_ids=[2])
        batch = sampler.generate(params, PROMPTS, sp, seed=4)
        assert alone.tokens[0] == batch.tokens[2]
        np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[2], atol=1e-5)
        np.testing.assert_allclose(alone.raw_logprobs[0], batch.raw_logprobs[2], atol=1e-5)
        one_row = (cfg.hidden_size, cfg.vocab_size) if layouts == "cpu" else None
        assert _table_copy_shape(sampler, params, [PROMPTS[2]], sp) == one_row
        assert _table_copy_shape(sampler, params, PROMPTS, sp) is None


def test_transposed_table_follows_new_parameters(qwen3, monkeypatch):
    """The [D, V] copy is made once per table, remade when the parameters change, and does not keep
    the old table alive."""
    import gc
    import weakref

    cfg, params = qwen3
    transposes = []
    monkeypatch.setattr(sampler_module, "_transpose", lambda t: transposes.append(1) or jnp.transpose(t))
    old = jax.tree.map(jnp.copy, params)
    new = jax.tree.map(lambda x: x[::-1] if x.shape == params["embed"].shape else x, params)  # rows permuted
    sampler, sp = Sampler(cfg), SamplingParams(max_new_tokens=16, greedy=True)
    before = sampler.generate(old, [PROMPTS[0]], sp).tokens
    assert sampler.generate(old, [PROMPTS[0]], sp).tokens == before and len(transposes) == 1
    after = sampler.generate(new, [PROMPTS[0]], sp).tokens
    assert len(transposes) == 2
    assert after != before, "the test needs parameters that decode differently"
    assert after == [Sampler(cfg).generate(new, PROMPTS, sp).tokens[0]]
    old_table = weakref.ref(old["embed"])
    del old
    gc.collect()
    assert old_table() is None


def test_attention_windows_grow_to_the_whole_cache():
    windows = sampler_module.attention_windows
    assert windows(64, 64 + 128) == [192]  # budgets up to 256 new tokens: one stage
    assert windows(64, 64 + 256) == [320]
    assert windows(64, 64 + 512) == [320, 576]
    assert windows(2048, 2048 + 4096) == [2304, 3072, 6144]


def test_decode_step_reads_only_its_window(qwen3):
    """NaN values past kv_len never reach the output; without kv_len the whole cache is read."""
    cfg, params = qwen3
    cache = KVCache.zeros(cfg, 1, 64)
    poisoned = KVCache(cache.k, cache.v.at[:, :, :, 32:].set(jnp.nan))
    mask = jnp.zeros((1, 64), bool).at[:, :5].set(True)

    @functools.partial(jax.jit, static_argnums=1)
    def step(cache, kv_len):
        hidden, _ = decoder(params, cfg, jnp.array([[7]]), jnp.array([[4]]), mask, cache, jnp.int32(4),
                            kv_len=kv_len)
        return hidden

    assert np.isfinite(step(poisoned, 32)).all()
    assert not np.isfinite(step(poisoned, None)).any()


@pytest.mark.parametrize("remat", [False, True])
def test_prefill_of_the_last_position_only(qwen3, remat):
    """last_only: the same cache and the same last hidden state as running every position through
    every layer, while the last layer carries on with one position (a [B, 1, D] result)."""
    cfg, params = qwen3
    cfg = cfg.replace(remat=remat)
    ids = jnp.array([[0, 0, 5, 9, 14, 3, 8, 2], [4, 11, 7, 1, 9, 9, 6, 13]])
    mask = ids > 0
    kv_mask = jnp.zeros((2, 16), bool).at[:, :8].set(mask)
    positions = jnp.maximum(jnp.cumsum(mask, axis=-1) - 1, 0)

    @functools.partial(jax.jit, static_argnums=0)
    def prefill(last_only):
        return decoder(params, cfg, ids, positions, kv_mask, KVCache.zeros(cfg, 2, 16), 0, last_only=last_only)

    (full, full_cache), (last, last_cache) = prefill(False), prefill(True)
    assert full.shape[1] == 8 and last.shape[1] == 1
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)
    assert np.abs(np.asarray(full[:, -1])).max() > 0.1
    for a, b in zip(last_cache, full_cache):
        np.testing.assert_array_equal(a, b)


def test_staged_decode_equals_one_stage(qwen3):
    """300 new tokens run as two stages (256 + 512 new-token windows): the same tokens and log-probs
    as attending over the whole cache at every step, and still the teacher-forced log-probs."""
    cfg, params = qwen3
    prompts = PROMPTS[:2]
    sp = SamplingParams(max_new_tokens=300, temperature=1.0)
    staged = Sampler(cfg).generate(params, prompts, sp, seed=4)
    whole = Sampler(cfg, first_window=10**6).generate(params, prompts, sp, seed=4)
    assert [len(t) for t in staged.tokens] == [300, 300]
    assert staged.tokens == whole.tokens
    for a, b in zip(staged.logprobs + staged.raw_logprobs, whole.logprobs + whole.raw_logprobs):
        np.testing.assert_allclose(a, b, atol=1e-6)
    logits = _teacher_forced_logits(params, cfg, prompts[0], staged.tokens[0])
    expected = jax.nn.log_softmax(logits, -1)[np.arange(300), staged.tokens[0]]
    np.testing.assert_allclose(staged.raw_logprobs[0], expected, atol=1e-5)


def test_padding_rows_start_done_so_decoding_ends_with_the_real_rows(qwen3):
    """Three prompts take a four-row batch bucket; its padding row (a dummy prompt) is never live, so
    the decode loop, which runs until every row is done, stops when the real rows stop instead of
    decoding the dummy prompt up to max_new_tokens."""
    cfg, params = qwen3
    sampler, prompts = Sampler(cfg), PROMPTS[:3]
    free = sampler.generate(params, prompts, SamplingParams(max_new_tokens=40, greedy=True))
    stops = frozenset(t[2] for t in free.tokens)  # every real row stops by its third token
    sp = SamplingParams(max_new_tokens=40, greedy=True, stop_token_ids=stops)
    args, static = sampler._arguments(params, prompts, sp, 0, None)
    assert args[2].shape[0] == 4
    tokens, _, _, lengths = jax.device_get(sampler._program(*args, **static))
    assert lengths.tolist()[3:] == [1] and not tokens[3, 1:].any(), lengths
    out = sampler.generate(params, prompts, sp)
    assert [len(t) for t in out.tokens] == lengths.tolist()[:3] and max(lengths) <= 3
    assert out.stats.slot_steps == 4 * (max(lengths) - 1)


def test_decode_loops_carry_weights_in_the_compute_dtype(qwen3):
    """fp32 parameters, bf16 compute: the weights are cast once per call, so the decode loops carry
    bf16 weights, not fp32 ones that each step would read and cast again (twice the bytes); the norms
    stay fp32."""
    cfg, params = qwen3
    sampler = Sampler(cfg.replace(compute_dtype="bfloat16"))
    args, static = sampler._arguments(params, PROMPTS, SamplingParams(max_new_tokens=300), 0, None)
    (program,) = jax.make_jaxpr(functools.partial(sampler._program, **static))(*args).eqns  # the jitted call
    loops = [e for e in program.params["jaxpr"].eqns if e.primitive.name == "while"]
    carried = [v.aval for e in loops for v in e.invars]
    weights = {x.shape for path, x in jax.tree_util.tree_leaves_with_path(params)
               if not str(path[-1].key).endswith("norm")}
    assert len(loops) == 2  # decode stages over 256 and then all 512 new-token slots
    assert {a.dtype for a in carried if a.shape in weights} == {jnp.dtype(jnp.bfloat16)}
    assert any(a.dtype == jnp.float32 and a.shape == params["final_norm"].shape for a in carried)


def test_decode_weights_are_cast_once_and_sample_the_same(qwen3):
    """`DecodeSetup.decode_weights` (what a continuous rollout hands its engines): bf16 weights and fp32
    norms for bf16 compute, with the same tokens as the fp32 parameters; fp32 compute: no copy."""
    cfg, params = qwen3
    assert all(a is b for a, b in zip(jax.tree.leaves(params),
                                       jax.tree.leaves(Sampler(cfg).setup.decode_weights(params))))
    sampler = Sampler(cfg.replace(compute_dtype="bfloat16"))
    cast = sampler.setup.decode_weights(params)
    assert cast["layers"][0]["q"].dtype == jnp.bfloat16 and cast["final_norm"].dtype == jnp.float32
    sp = SamplingParams(max_new_tokens=12)
    assert sampler.generate(cast, PROMPTS, sp, seed=3).tokens == sampler.generate(params, PROMPTS, sp, seed=3).tokens


def test_gpu_programs_decode_stacked_layers_as_a_list(qwen3):
    """Traced for a GPU, a scanned model's weights are split per layer as they are cast: the decode loops
    carry no stacked weights (XLA:GPU would copy each layer out of the stack every step), with the same
    tokens as the per-layer list."""
    cfg, params = qwen3
    stacked = dict(params, layers=jax.tree.map(lambda *layer: jnp.stack(layer), *params["layers"]))
    cfg = cfg.replace(compute_dtype="bfloat16", attention="xla")
    sp = SamplingParams(max_new_tokens=12)
    with cpu.compiling_for("gpu"):
        want = Sampler(cfg).generate(params, PROMPTS, sp, seed=4).tokens
        sampler = Sampler(cfg.replace(scan_layers=True))
        got = sampler.generate(stacked, PROMPTS, sp, seed=4).tokens
        args, static = sampler._arguments(stacked, PROMPTS, sp, 0, None)
        (program,) = jax.make_jaxpr(functools.partial(sampler._program, **static))(*args).eqns
    assert got == want
    loops = [e for e in program.params["jaxpr"].eqns if e.primitive.name == "while"]
    assert loops and not any(v.aval.shape == stacked["layers"]["q"].shape for e in loops for v in e.invars)


def test_gpu_programs_decode_an_uncast_stack_unrolled(qwen3):
    """Traced for a GPU, stacked weights that need no cast (here fp32 weights and compute; a LoRA run's
    frozen bf16 stack) stay stacked, and the decode loops run the layers unrolled over static slices
    of it (a scanned loop on GPU copies each layer's weights and cache windows every step); the same
    tokens as the per-layer list. Traced for CPU the loops scan the stack."""
    cfg, params = qwen3
    cfg = cfg.replace(attention="xla")
    stacked = dict(params, layers=jax.tree.map(lambda *layer: jnp.stack(layer), *params["layers"]))
    sp = SamplingParams(max_new_tokens=12)

    def decode_loops(sampler):
        args, static = sampler._arguments(stacked, PROMPTS, sp, 0, None)
        (program,) = jax.make_jaxpr(functools.partial(sampler._program, **static))(*args).eqns
        return [e for e in program.params["jaxpr"].eqns if e.primitive.name == "while"]

    def scans(jaxpr):
        inner = (sub for e in jaxpr.eqns for sub in jax.extend.core.jaxprs_in_params(e.params))
        return sum(e.primitive.name == "scan" for e in jaxpr.eqns) + sum(scans(j) for j in inner)

    with cpu.compiling_for("gpu"):
        want = Sampler(cfg).generate(params, PROMPTS, sp, seed=4).tokens
        sampler = Sampler(cfg.replace(scan_layers=True))
        got = sampler.generate(stacked, PROMPTS, sp, seed=4).tokens
        gpu_loops = decode_loops(sampler)
    assert got == want
    assert gpu_loops and any(v.aval.shape == stacked["layers"]["q"].shape for e in gpu_loops for v in e.invars)
    assert not any(scans(e.params["body_jaxpr"].jaxpr) for e in gpu_loops)
    assert all(scans(e.params["body_jaxpr"].jaxpr) for e in decode_loops(Sampler(cfg.replace(scan_layers=True))))


def test_only_weights_that_are_cast_anyway_are_split_per_layer(qwen3):
    """fp32 weights with bf16 compute are all cast (copied), so splitting them costs nothing; bf16 weights
    with fp32 adapters (LoRA beside frozen weights) are not, and a split would copy them."""
    cfg, params = qwen3
    cfg = cfg.replace(compute_dtype="bfloat16")
    assert transformer.casts_weights(params, cfg, every=True)
    frozen = jax.tree_util.tree_map_with_path(
        lambda path, x: x if str(path[-1].key).endswith("norm") else x.astype(jnp.bfloat16), params)
    layers = [dict(layer, q_lora_a=jnp.zeros((4, cfg.hidden_size))) for layer in frozen["layers"]]
    with_adapters = dict(frozen, layers=layers)
    assert transformer.casts_weights(with_adapters, cfg)
    assert not transformer.casts_weights(with_adapters, cfg, every=True)
    assert not transformer.casts_weights(frozen, cfg)


def test_stacked_layers_sample_like_a_layer_list(qwen3):
    """Stacked (scanned) layers: the layer index inside the decode step is traced (the CPU attention
    kernel reads it at run time); the same tokens and log-probs as the per-layer list."""
    cfg, params = qwen3
    stacked_params = dict(params, layers=jax.tree.map(lambda *layer: jnp.stack(layer), *params["layers"]))
    sp = SamplingParams(max_new_tokens=12)
    listed = Sampler(cfg).generate(params, PROMPTS, sp, seed=2)
    stacked = Sampler(cfg.replace(scan_layers=True)).generate(stacked_params, PROMPTS, sp, seed=2)
    assert stacked.tokens == listed.tokens
    for a, b in zip(stacked.logprobs, listed.logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_stop_tokens_and_finish_reason(qwen3):
    cfg, params = qwen3
    sampler = Sampler(cfg)
    free = sampler.generate(params, PROMPTS, SamplingParams(max_new_tokens=12, greedy=True))
    stop = free.tokens[0][4]
    out = sampler.generate(params, PROMPTS, SamplingParams(max_new_tokens=12, greedy=True,
                                                           stop_token_ids={stop, 10**6}))
    for full, got, reason in zip(free.tokens, out.tokens, out.finish_reasons):
        if stop in full:
            cut = full.index(stop) + 1
            assert got == full[:cut] and reason == "stop"
        else:
            assert got == full and reason == "length"
    assert out.finish_reasons[0] == "stop" and len(out.tokens[0]) <= 5


@pytest.mark.parametrize("mesh_shape", [dict(data=2, fsdp=2, tensor=2), dict(data=1, fsdp=8, tensor=1)])
def test_sharded_sampler_matches_single_device(hf_model, mesh_shape, layouts):
    _, path, _ = hf_model
    cfg, params = load_pretrained(path)
    sp = SamplingParams(max_new_tokens=16, greedy=True)
    single = Sampler(cfg).generate(params, PROMPTS, sp)
    mesh = make_mesh(**mesh_shape)
    cfg_s, params_s = load_pretrained(path, mesh=mesh, rules="sample")
    sharded = Sampler(cfg_s, mesh=mesh).generate(params_s, PROMPTS, sp)
    assert sharded.tokens == single.tokens


def test_sharded_staged_decode_matches_single_device(qwen3, layouts):
    """Under a 2x2x2 mesh, 16 new tokens decoded in two stages (a first window of 4 new slots, then all):
    the same greedy tokens and log-probs as one device attending over the whole cache."""
    cfg, params = qwen3
    sp = SamplingParams(max_new_tokens=16, greedy=True)
    single = Sampler(cfg).generate(params, PROMPTS, sp)
    sharded = Sampler(cfg, mesh=make_mesh(data=2, fsdp=2, tensor=2), first_window=4).generate(params, PROMPTS, sp)
    assert sharded.tokens == single.tokens
    for a, b in zip(sharded.raw_logprobs, single.raw_logprobs):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_no_recompilation_within_buckets(qwen3):
    cfg, params = qwen3
    sampler = Sampler(cfg)
    sp = SamplingParams(max_new_tokens=10, temperature=0.9, top_p=0.9)
    sampler.generate(params, PROMPTS, sp, seed=0)  # warm-up
    before = compile_count()
    sampler.generate(params, [[1, 2], [3] * 40, [4] * 9], sp, seed=1)
    sampler.generate(params, PROMPTS[::-1], SamplingParams(max_new_tokens=13, temperature=0.5, top_p=0.5,
                                                           stop_token_ids={3}), seed=2)
    assert compile_count() == before
    sampler.generate(params, [[1] * 100], sp)  # a new prompt bucket compiles
    assert compile_count() > before


def test_clear_errors(qwen3):
    cfg, params = qwen3
    sampler = Sampler(cfg, max_prompt_len=64, max_cache_len=128)
    sp = SamplingParams(max_new_tokens=8)
    with pytest.raises(ValueError, match="at least one prompt"):
        sampler.generate(params, [], sp)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate(params, [[1], []], sp)
    with pytest.raises(ValueError, match="prompt 0 has 65 tokens, more than max_prompt_len=64"):
        sampler.generate(params, [[1] * 65], sp)
    with pytest.raises(ValueError, match=rf"prompt 1 has token id {cfg.vocab_size}, outside the model's vocabulary"):
        sampler.generate(params, [[1, 2], [3, cfg.vocab_size]], sp)
    with pytest.raises(ValueError, match="prompt 0 has token id -1"):
        sampler.generate(params, [[-1, 2]], sp)
    with pytest.raises(ValueError, match=f"prompt 0 has token id {2**40}"):  # past int32 too
        sampler.generate(params, [[1, 2**40]], sp)
    # Parameters of another model size must not run: extra layers would silently clamp into the cache.
    with pytest.raises(ValueError, match=r"parameter \['layers'\]\[2\]\['\w+'\] is not part of this model"):
        sampler.generate({**params, "layers": params["layers"] + [params["layers"][0]]}, [[1]], sp)
    narrow = jax.tree.map(lambda x: x[..., :-1] if x.ndim == 2 else x, params)
    with pytest.raises(ValueError, match=r"parameter \['embed'\] has shape \(\d+, \d+\), the config expects"):
        sampler.generate(narrow, [[1]], sp)
    with pytest.raises(ValueError, match=r"parameter \['final_norm'\] \(shape \(\d+,\)\) is missing"):
        sampler.generate({k: v for k, v in params.items() if k != "final_norm"}, [[1]], sp)
    # NaN weights (a corrupt checkpoint) gave tokens past the vocabulary with NaN log-probs.
    broken = {**params, "layers": [{**params["layers"][0], "q": params["layers"][0]["q"].at[0, 0, 0].set(jnp.nan)},
                                   *params["layers"][1:]]}
    for broken_sp in (sp, SamplingParams(max_new_tokens=8, greedy=True)):
        with pytest.raises(FloatingPointError, match="logits are NaN or infinite .prompt 0, new token 0."):
            sampler.generate(broken, [[1, 2, 3]], broken_sp)
    with pytest.raises(ValueError, match="max_new_tokens=100 does not fit the KV cache"):
        sampler.generate(params, [[1] * 40], SamplingParams(max_new_tokens=100))
    for temperature in (0.0, 1e-46, 1e-6):  # 1e-46 is 0 in float32
        with pytest.raises(ValueError, match="temperature must be at least 1e-05 .use greedy=True"):
            SamplingParams(temperature=temperature)
    with pytest.raises(ValueError, match="top_p must be in .0, 1. and not round to 0 in float32"):
        SamplingParams(top_p=1e-46)
    assert SamplingParams(top_k=2**40).top_k == np.iinfo(np.int32).max  # keeps the whole vocabulary
    with pytest.raises(ValueError, match="first_window must be an int >= 1"):
        Sampler(cfg, first_window=0)
    with pytest.raises(ValueError, match="pair 1 has an empty prompt"):
        sequence_logprobs(params, cfg, [([1], [2]), ([], [3])])


def test_prompts_seeds_and_row_ids_of_the_wrong_kind_are_named(qwen3):
    """Float ids and row ids were truncated to ints; text, a flat list of ids and a float seed failed deep
    in numpy or jax.random. Each is named before anything compiles."""
    cfg, params = qwen3
    sampler = Sampler(cfg, max_prompt_len=64, max_cache_len=128)
    sp = SamplingParams(max_new_tokens=4)
    for prompts, match in [([[1.5, 2.0]], "prompt 0 holds float64 values"), ([[True, False]], "prompt 0 holds bool"),
                           (["hello"], "prompt 0 is str, not a list of int token ids; tokenize"),
                           ([1, 2, 3], r"prompt 0 is int, .* wrap a single prompt in a list"),
                           ([[1], [[2], [3]]], r"prompt 1 holds int64 values of shape \(2, 1\)"),
                           ([[1], [[2], 3]], "prompt 1 holds object values"), ("abc", "prompts must be a list"),
                           ((p for p in [[1]]), "prompts must be a list")]:
        with pytest.raises(TypeError, match=match):
            sampler.generate(params, prompts, sp)
    with pytest.raises(ValueError, match=f"prompt 0 has token id {10**30}, outside"):  # past int64
        sampler.generate(params, [[1, 10**30]], sp)
    for seed in (1.5, jax.random.key(0), None):
        with pytest.raises(TypeError, match="seed must be an int, got"):
            sampler.generate(params, [[1]], sp, seed=seed)
    with pytest.raises(TypeError, match="a row id must be an int, got 0.5"):
        sampler.generate(params, [[1], [2]], sp, row_ids=[0.5, 1])
    with pytest.raises(TypeError, match="sampling_params must be a SamplingParams, got dict"):
        sampler.generate(params, [[1]], {"max_new_tokens": 4})
    with pytest.raises(TypeError, match="cfg must be a ModelConfig"):
        Sampler(params)
    with pytest.raises(ValueError, match="max_cache_len must be an int >= 1, got -1"):
        Sampler(cfg, max_cache_len=-1)
    with pytest.raises(ValueError, match="first_window must be an int >= 1"):
        Sampler(cfg, first_window=2.5)
    # What is accepted samples as lists of ints do: numpy rows and ids; seeds and row ids modulo 2**32,
    # past int64 too (jax.random.key raised an OverflowError).
    want = sampler.generate(params, [[1, 2, 3], [4]], sp, seed=2**32 - 1, row_ids=[3, 2**32 - 2]).tokens
    assert sampler.generate(params, [np.array([1, 2, 3], np.int64), np.array([4], np.uint8)], sp, seed=2**70 - 1,
                            row_ids=np.array([2**32 + 3, -2])).tokens == want


@pytest.mark.parametrize("fields, error, match", [
    (dict(max_new_tokens=2.5), TypeError, "max_new_tokens must be an int, got 2.5"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int, got True"),
    (dict(temperature=True), TypeError, "temperature must be a number, got True"),
    (dict(temperature="0.5"), TypeError, "temperature must be a number"),
    (dict(temperature=float("inf")), ValueError, "finite in float32"),
    (dict(temperature=1e39), ValueError, "finite in float32"),
    (dict(top_p=True), TypeError, "top_p must be a number"),
    (dict(top_k=2.5), TypeError, "top_k must be an int, got 2.5"),
    (dict(top_k=float("inf")), TypeError, "top_k must be an int"),
    (dict(greedy="no"), TypeError, "greedy must be True or False, got 'no'"),
    (dict(stop_token_ids="12"), TypeError, "stop_token_ids must be a collection of token ids"),
    (dict(stop_token_ids=5), TypeError, r"wrap one id in a set"),
    (dict(stop_token_ids={1.5}), TypeError, "a stop token id must be an int, got 1.5"),
    (dict(stop_token_ids={-1}), ValueError, "stop token id -1 is no token id"),
    (dict(stop_token_ids={2**40}), ValueError, f"stop token id {2**40} is no token id"),
])
def test_sampling_params_of_the_wrong_kind_are_named(fields, error, match):
    """int() and bool() took these silently: 2.5 new tokens as 2, greedy="no" as greedy, "12" as stop ids 1
    and 2, True as a temperature of 1."""
    with pytest.raises(error, match=match):
        SamplingParams(**fields)


def test_sampling_params_take_numpy_scalars():
    sp = SamplingParams(np.int64(4), np.float32(0.5), np.int32(3), np.float64(0.9), np.bool_(False),
                        stop_token_ids=np.array([2, 3]))
    assert sp == SamplingParams(4, 0.5, 3, 0.9, stop_token_ids={2, 3}) and type(sp.max_new_tokens) is int


@pytest.mark.slow
def test_bf16_greedy_decode_follows_the_bf16_forward(qwen3):
    """In bf16 the cached decode picks the token a full bf16 forward pass over the same tokens ranks
    first, wherever that choice is clear: the top two logits more than 0.1 apart (bf16 logits of
    this model are off the fp32 ones by up to about 0.05, tests/models/test_hf_parity.py, and the
    decode and the forward round in different places). Close calls are skipped, but most positions
    of a random model's output are clear enough for the test to say something."""
    cfg, params = qwen3
    cfg = cfg.replace(compute_dtype="bfloat16")  # the same fp32 master weights, bf16 compute
    # The reference forward is compiled (`_forward`), as the sampler's decode is; run eagerly, each of
    # its primitives would compile anew for every sequence length.
    out = Sampler(cfg).generate(params, PROMPTS, SamplingParams(max_new_tokens=24, greedy=True))
    checked = 0
    for prompt, tokens in zip(PROMPTS, out.tokens):
        logits = np.asarray(_forward(params, cfg, np.asarray([prompt + tokens]))[0], np.float32)
        for t, token in enumerate(tokens):
            top2 = np.sort(logits[len(prompt) + t - 1])[-2:]
            if top2[1] - top2[0] < 0.1:
                continue
            assert token == int(np.argmax(logits[len(prompt) + t - 1])), (t, tokens)
            checked += 1
    assert checked >= 0.25 * sum(map(len, out.tokens)), checked


def test_adapters_beside_the_frozen_weights_sample_like_the_merged_weights(qwen3):
    """LoRA's sampler without a merged copy (`model.lora.sample="adapters"`, each adapter's input
    behind a barrier in a decode step) decodes the merged policy's greedy tokens and log-probs."""
    from spiral_jax.models import lora

    cfg, frozen = qwen3
    cfg = cfg.replace(lora_rank=4, lora_alpha=8.0)
    adapters = lora.init_adapters(cfg, jax.random.key(1))
    adapters = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(2), x.shape), adapters)
    full = lora.join(frozen, adapters)
    sp = SamplingParams(max_new_tokens=12, greedy=True)
    beside = Sampler(cfg).generate(full, PROMPTS, sp)
    merged = Sampler(cfg.base()).generate(lora.merge(full, cfg), PROMPTS, sp)
    plain = Sampler(cfg.base()).generate(frozen, PROMPTS, sp)
    assert beside.tokens == merged.tokens != plain.tokens
    np.testing.assert_allclose(np.concatenate(beside.logprobs), np.concatenate(merged.logprobs), atol=1e-4)
