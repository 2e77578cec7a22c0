"""Chunked log-probs, the loss gradient against independent computations, padding and micro-batch
invariance, PPO epoch 1 == REINFORCE, and where the clip, TIS and KL terms act."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import forward, init_params
from spiral_jax.rl import losses
from spiral_jax.rl.samples import TurnSample, pack
from spiral_jax.rl.train_step import TrainConfig, loss_and_grads, make_compute_logprobs
from tests.rl.helpers import TINY, assert_trees_close, random_samples

SAMPLES = random_samples(6, seed=1)


@pytest.fixture(scope="module")
def params():
    return init_params(TINY, jax.random.key(0), std=0.2)  # std 0.2: log-probs far from uniform


@functools.partial(jax.jit, static_argnums=(2,))
def _grads(params, batch, tc):
    return loss_and_grads(params, batch, TINY, tc)


def _direct_logprobs(params, samples, length=32):
    """Per sample, log p of each response token from full [B, T, V] logits (no packing, no chunks)."""
    ids = np.zeros((len(samples), length), np.int32)
    mask = np.zeros((len(samples), length), bool)
    for row, s in enumerate(samples):
        n = len(s.prompt_ids) + len(s.response_ids)
        ids[row, :n], mask[row, :n] = list(s.prompt_ids) + list(s.response_ids), True
    logp = jax.nn.log_softmax(forward(params, TINY, ids, mask), axis=-1)
    out = []
    for row, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        out.append(logp[row, np.arange(p - 1, p + r - 1), s.response_ids])
    return out


@pytest.mark.parametrize("chunk", [4, 32])
def test_chunked_logprobs_and_entropy_equal_full_logits(params, chunk):
    batch = pack(SAMPLES, min_length=32)
    logp, entropy = jax.jit(losses.token_logprobs, static_argnums=(1, 3))(params, TINY, batch, chunk)
    logits = jax.jit(forward, static_argnums=1)(params, TINY, batch.tokens, batch.segment_ids > 0,
                                                batch.positions)
    full = jax.nn.log_softmax(logits, axis=-1)
    want_logp = np.take_along_axis(np.asarray(full), batch.targets[..., None], -1)[..., 0]
    want_entropy = -np.sum(np.exp(full) * full, axis=-1)
    on = batch.loss_mask > 0
    assert np.all(np.asarray(logp)[~on] == 0)  # only response slots are unembedded
    np.testing.assert_allclose(np.asarray(logp)[on], want_logp[on], atol=1e-5)
    np.testing.assert_allclose(np.asarray(entropy)[on], want_entropy[on], atol=1e-5)


def test_a_one_token_prompt_first_in_a_row_is_scored_once(params):
    """Its first response token is predicted at slot 0, which the unused response-slot entries of its
    row (fewer answer tokens than the batch's longest row) must not read again."""
    samples = [TurnSample([5], [7, 9], [-1.0, -1.0], "g", 0, 0, 1.0),
               TurnSample([3, 4], [6] * 7, [-1.0] * 7, "g", 1, 0, 1.0)]
    batch = pack(samples, min_length=16)
    assert batch.loss_mask[0, 0] == 1 and batch.response_slots.shape[1] > 2
    logp, _ = jax.jit(losses.token_logprobs, static_argnums=(1, 3))(params, TINY, batch, 16)
    np.testing.assert_allclose(np.asarray(logp)[0, :3], [*_direct_logprobs(params, samples)[0], 0.0], atol=1e-5)


@pytest.mark.parametrize("per_row", [1, 3, 6])
def test_gradient_equals_autodiff_of_direct_per_token_sum(params, per_row):
    """The reference's objective written out sample by sample, without packing, chunks or masks; the
    packed batch holds one sample a row, or several (each attending to itself alone)."""
    def direct_loss(params):
        logps = _direct_logprobs(params, SAMPLES)
        return sum(-s.advantage * jnp.sum(lp) / 4096.0 for s, lp in zip(SAMPLES, logps)) / len(SAMPLES)

    want_loss, want_grads = jax.jit(jax.value_and_grad(direct_loss))(params)
    batch = pack(SAMPLES, samples_per_row=per_row, row_multiple=2, min_length=64)
    assert batch.segment_ids.max() == min(per_row, 4)  # 64 slots hold 4 of these samples at most
    loss, grads, _ = _grads(params, batch, TrainConfig())
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    assert_trees_close(grads, want_grads)


def test_response_chunks_divide_the_quarter_octave_buckets():
    assert [losses.response_chunk(512, r) for r in (64, 512, 1280, 1536, 5120, 7168)] == [64, 512, 256, 512, 512, 512]
    assert losses.response_chunk(4, 10) == 2


def test_gradient_equals_finite_differences(params):
    batch, tc = pack(SAMPLES, rows=8), TrainConfig()
    _, grads, _ = _grads(params, batch, tc)
    leaves, treedef = jax.tree.flatten(params)
    g_leaves = jax.tree.leaves(grads)
    eps = 1e-3
    for i in (0, 5, len(leaves) - 1):  # embedding, a mid-layer weight, the last weight
        flat = np.asarray(g_leaves[i]).ravel()
        j = int(np.argmax(np.abs(flat)))
        diffs = []
        for sign in (1, -1):
            bumped = np.asarray(leaves[i]).copy().ravel()
            bumped[j] += sign * eps
            new = list(leaves)
            new[i] = jnp.asarray(bumped.reshape(leaves[i].shape))
            diffs.append(float(_grads(jax.tree.unflatten(treedef, new), batch, tc)[0]))
        assert (diffs[0] - diffs[1]) / (2 * eps) == pytest.approx(flat[j], rel=1e-2)


def test_padding_bucket_and_micro_batches_do_not_change_loss_or_gradient(params):
    loss, grads, _ = _grads(params, pack(SAMPLES, rows=8), TrainConfig())
    for batch, tc in [(pack(SAMPLES, rows=16, min_length=64), TrainConfig()),  # more padding
                      (pack(SAMPLES, rows=8), TrainConfig(micro_batch_size=4)),  # 2 micro-batches
                      (pack(SAMPLES, rows=4, samples_per_row=4, min_length=64), TrainConfig(micro_batch_size=2))]:
        other_loss, other_grads, _ = _grads(params, batch, tc)
        np.testing.assert_allclose(other_loss, loss, rtol=1e-5)
        assert_trees_close(other_grads, grads)


def test_ppo_epoch_one_equals_reinforce(params):
    batch = pack(SAMPLES, rows=8)
    ppo = TrainConfig(epochs=2, clip=0.2, micro_batch_size=4)
    old = make_compute_logprobs(TINY, ppo)(params, batch)
    assert not np.asarray(old)[batch.loss_mask == 0].any()
    _, ppo_grads, (_, _, clipped) = _grads(params, batch._replace(old_logprobs=old), ppo)
    _, grads, _ = _grads(params, batch, TrainConfig(micro_batch_size=4))
    assert not np.asarray(clipped).any()
    assert_trees_close(ppo_grads, grads)


def _token_grad(logp, batch, **kw):
    """d(sum of token losses)/d logp, and the clip flags."""
    (_, clipped), grad = jax.value_and_grad(
        lambda lp: (jnp.sum(losses.token_loss(lp, batch, **kw)[0]), losses.token_loss(lp, batch, **kw)[1]),
        has_aux=True)(logp)
    return np.asarray(grad), np.asarray(clipped)


def _synthetic(ratios, adv, **fields):
    """One row per (ratio, advantage): the old log-prob sits log(ratio) below the current one."""
    n = len(ratios)
    logp = jnp.full((n, 1), -2.0)
    base = pack(random_samples(n, max_prompt=2, max_response=1), min_length=1)
    batch = base._replace(loss_mask=np.ones((n, 1), np.float32), segment_ids=np.ones((n, 1), np.int32),
                          advantages=np.asarray(adv, np.float32)[:, None],
                          old_logprobs=np.asarray(-2.0 - np.log(ratios), np.float32)[:, None],
                          **fields)
    return logp, batch


def test_clip_acts_only_when_the_ratio_leaves_the_range():
    ratios = np.array([1.0, 1.1, 1.3, 1.3, 0.7, 0.7, 0.9])
    adv = np.array([1.0, 1.0, 1.0, -1.0, -1.0, 1.0, -1.0])
    logp, batch = _synthetic(ratios, adv)
    grad, clipped = _token_grad(logp, batch, on_policy=False, clip=0.2, tis_cap=None, kl_coef=0.0)
    # Clipped (no gradient) only where the ratio left [0.8, 1.2] in the advantage's direction.
    want_clipped = np.array([0, 0, 1, 0, 1, 0, 0], bool)
    np.testing.assert_array_equal(clipped[:, 0], want_clipped)
    np.testing.assert_allclose(grad[:, 0], np.where(want_clipped, 0.0, -adv * ratios), rtol=1e-5)
    unclipped, _ = _token_grad(logp, batch, on_policy=False, clip=None, tis_cap=None, kl_coef=0.0)
    np.testing.assert_allclose(unclipped[:, 0], -adv * ratios, rtol=1e-5)


def test_truncated_importance_weight():
    ratios = np.ones(3)
    logp, batch = _synthetic(ratios, [1.0, 1.0, -2.0])
    # learner/sampler probability ratios 0.5, 1.5 and 4 (capped at 2).
    sampler = np.asarray(-2.0 - np.log([0.5, 1.5, 4.0]), np.float32)[:, None]
    batch = batch._replace(sampler_logprobs=sampler)
    grad, _ = _token_grad(logp, batch, on_policy=True, clip=None, tis_cap=2.0, kl_coef=0.0)
    np.testing.assert_allclose(grad[:, 0], [-0.5, -1.5, 4.0], rtol=1e-5)


def test_kl_to_reference_and_masked_overflow():
    logp, batch = _synthetic(np.ones(3), [0.0, 0.0, 0.0])
    batch = batch._replace(ref_logprobs=np.array([[-2.0], [-1.0], [-3.0]], np.float32))
    kl = np.asarray(losses.kl_to_reference(logp, batch.ref_logprobs))[:, 0]
    assert kl[0] == 0.0 and (kl[1:] > 0).all()
    grad, _ = _token_grad(logp, batch, on_policy=True, clip=None, tis_cap=None, kl_coef=0.5)
    np.testing.assert_allclose(grad[:, 0], 0.5 * (1 - np.exp(batch.ref_logprobs[:, 0] + 2.0)), rtol=1e-5)
    # A padding slot whose log-prob would overflow exp() leaves the gradient finite.
    masked = batch._replace(loss_mask=np.array([[1.0], [1.0], [0.0]], np.float32),
                            ref_logprobs=np.array([[-2.0], [-1.0], [0.0]], np.float32))
    grad, _ = _token_grad(logp.at[2, 0].set(-200.0), masked, on_policy=True, clip=None, tis_cap=None,
                          kl_coef=0.5)
    assert np.isfinite(grad).all() and grad[2, 0] == 0.0


def test_token_weights():
    """"constant" divides by the samples, however they are packed into rows; "token_mean" by the tokens."""
    samples = random_samples(4, seed=5)
    for per_row in (1, 4):
        batch = pack(samples, rows=4, samples_per_row=per_row, min_length=64)
        mask = batch.loss_mask
        w = np.asarray(losses.token_weights(batch, "constant", 4096.0))
        np.testing.assert_allclose(w.sum(), mask.sum() / (4096.0 * 4), rtol=1e-6)
        np.testing.assert_allclose(w[mask > 0], 1 / (4096.0 * 4), rtol=1e-6)
        w = np.asarray(losses.token_weights(batch, "token_mean"))
        np.testing.assert_allclose(w[mask > 0], 1 / mask.sum(), rtol=1e-6)
        assert w.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="normaliser"):
        losses.token_weights(batch, "sum")
