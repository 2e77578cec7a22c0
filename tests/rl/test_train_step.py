"""The jitted train step: 8-device == 1-device, the NaN guard, learning direction, PPO epochs, the
train step compiled beside the old-log-prob pass, the sampler hand-over, and the optimiser settings."""
import threading
import time

import jax
import numpy as np
import pytest

from spiral_jax.models import cpu, forward, init_params, param_shardings
from spiral_jax.rl.reshard import make_policy, make_reshard, sample_config, split_frozen
from spiral_jax.rl.samples import TurnSample, pack, shard_batch
from spiral_jax.rl.train_step import (TrainConfig, init_train_state, make_compute_logprobs,
                                      make_schedule, make_train_step, make_update)
from spiral_jax.sampling.ahead import CompileAhead
from spiral_jax.sharding import Rules, make_mesh
from tests.rl.helpers import TINY, random_samples

TC = TrainConfig(learning_rate=1e-3, micro_batch_size=4, logprob_chunk=16)
STOP = 5


@pytest.fixture(scope="module")
def host_params():
    return jax.tree.map(np.asarray, init_params(TINY, jax.random.key(0)))


@pytest.fixture(scope="module")
def step():
    return make_train_step(TINY, TC)


@pytest.fixture(scope="module")
def logprobs():
    return make_compute_logprobs(TINY, TC)


def _state(host_params, tc=TC, mesh=None):
    return init_train_state(jax.tree.map(jax.numpy.asarray, host_params), TINY, tc, mesh)


def _host(tree):
    return jax.tree.map(np.asarray, tree)


def test_sharded_step_equals_single_device(host_params, step, logprobs, layouts):
    """The mesh side is compiled under each `layouts`; with the accelerators' it is what a TPU pod runs."""
    batch = pack(random_samples(8, seed=2), row_multiple=4)
    want_logprobs = logprobs(jax.tree.map(jax.numpy.asarray, host_params), shard_batch(batch, None))
    single, single_metrics = step(_state(host_params), shard_batch(batch, None))

    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    state, on_mesh = _state(host_params, mesh=mesh), shard_batch(batch, mesh)
    got_logprobs = make_compute_logprobs(TINY, TC, mesh)(state.params, on_mesh)
    np.testing.assert_allclose(got_logprobs, want_logprobs, atol=1e-5)
    sharded, metrics = make_train_step(TINY, TC, mesh)(state, on_mesh)
    train = param_shardings(TINY, Rules.create(mesh, "train"))
    for p, s, mu in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(train),
                        jax.tree.leaves(sharded.opt_state[1][0].mu)):
        assert p.sharding.is_equivalent_to(s, p.ndim) and mu.sharding.is_equivalent_to(s, p.ndim)
    assert any(len(s.spec) and s.spec[0] for s in jax.tree.leaves(train))  # something is split
    # Adam's first step is about lr * sign(g): compare the updates, to 1% of a step.
    for a, b, p0 in zip(jax.tree.leaves(sharded.params), jax.tree.leaves(single.params),
                        jax.tree.leaves(host_params)):
        np.testing.assert_allclose(np.asarray(a) - p0, np.asarray(b) - p0, atol=1e-2 * TC.learning_rate)
    assert int(sharded.step) == int(single.step) == 1
    for name, value in single_metrics.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-4, atol=1e-7, err_msg=name)


def test_nan_in_a_batch_skips_the_update(host_params, step):
    batch = pack(random_samples(8, seed=3), row_multiple=4)
    state = _state(host_params)
    before = _host(state)
    poisoned = batch._replace(advantages=batch.advantages.copy())
    poisoned.advantages[1, 0] = np.nan
    state, metrics = step(state, shard_batch(poisoned, None))
    after = _host(state)
    for a, b in zip(jax.tree.leaves(after.params) + jax.tree.leaves(after.opt_state),
                    jax.tree.leaves(before.params) + jax.tree.leaves(before.opt_state)):
        np.testing.assert_array_equal(a, b)  # bit for bit
    assert (int(state.step), int(state.skipped)) == (0, 1)
    assert metrics["skipped"] == 1 and metrics["nonfinite_loss"] == 1 and metrics["nonfinite_grads"] > 0
    state, metrics = step(state, shard_batch(batch, None))  # a clean batch still trains
    assert (int(state.step), int(state.skipped)) == (1, 1)
    assert metrics["skipped"] == 0 and metrics["skipped_total"] == 1
    assert not np.array_equal(np.asarray(state.params["embed"]), before.params["embed"])


def _toy_batch():
    """One prompt; two responses, the first rewarded (+1), the second punished (-1)."""
    good, bad = [10, 11, 12, STOP], [20, 21, 22, STOP]
    samples = [TurnSample([1, 2, 3], resp, [0.0] * 4, "toy", i % 2, 0, adv)
               for i, (resp, adv) in enumerate([(good, 1.0), (bad, -1.0)] * 2)]
    return pack(samples, rows=8, min_length=32)  # the shape of the other tests' batches: no recompile


def _response_logprob(logprobs, batch):
    return np.asarray(logprobs).sum(-1)[:2]  # rows 0 (good) and 1 (bad)


def test_one_step_moves_the_policy_the_right_way(host_params, step, logprobs):
    batch = shard_batch(_toy_batch(), None)
    state = _state(host_params)
    good0, bad0 = _response_logprob(logprobs(state.params, batch), batch)
    state, _ = step(state, batch)
    good1, bad1 = _response_logprob(logprobs(state.params, batch), batch)
    assert good1 > good0 + 0.1 and bad1 < bad0 - 0.1


def test_ppo_update_with_tis_and_kl(host_params, logprobs):
    """Two PPO epochs via make_update, with the sampler's log-probs and a frozen reference."""
    tc = TrainConfig(learning_rate=3e-3, epochs=2, clip=0.2, tis_cap=2.0, kl_coef=0.1, micro_batch_size=4,
                     logprob_chunk=16)
    state = _state(host_params, tc)
    batch = shard_batch(_toy_batch(), None)
    sampled = logprobs(state.params, batch)  # what a sampler with these parameters would report
    batch = batch._replace(sampler_logprobs=sampled)
    ref = jax.tree.map(jax.numpy.asarray, host_params)
    update = make_update(TINY, tc)
    with pytest.raises(ValueError, match="ref_params"):
        update(state, batch)
    state, metrics = update(state, batch, ref_params=ref)
    assert int(state.step) == 2 and len(metrics) == 2
    first, second = metrics
    assert first["clip_fraction"] == 0  # epoch 1: ratio exactly 1 (REINFORCE)
    assert first["drift_max"] < 1e-5 and first["drift_outside"] == 0
    assert first["tis_weight"] == pytest.approx(1.0, abs=1e-5) and first["kl"] < 1e-6
    assert second["clip_fraction"] > 0 and second["kl"] > 0  # one step off-policy
    assert second["drift_mean"] > 0.01
    good0, bad0 = _response_logprob(sampled, batch)
    good1, bad1 = _response_logprob(logprobs(state.params, batch), batch)
    assert good1 > good0 and bad1 < bad0


@pytest.mark.parametrize("sharded", [False, True])
def test_the_train_step_compiles_beside_the_old_log_prob_pass(host_params, sharded):
    """With a compile-ahead thread the epochs' program compiles in the background while the old-log-prob
    pass is made; the epochs then run it without compiling again, and update as without the thread."""
    tc = TrainConfig(learning_rate=3e-3, epochs=2, clip=0.2, micro_batch_size=4, logprob_chunk=16)
    mesh = make_mesh(data=2, fsdp=2, tensor=2) if sharded else None
    batch = shard_batch(_toy_batch(), mesh)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compiles.append((kw.get("fun_name"), threading.current_thread().name))
        if event.endswith("backend_compile_duration") else None)
    update, state = make_update(TINY, tc, mesh, ahead=CompileAhead(1)), _state(host_params, tc, mesh)
    passes = update.logprob_passes

    def once_the_thread_has_the_step(*args):  # else a quick pass (a cache load) may take it back
        deadline = time.monotonic() + 10
        while update.ahead._queued and time.monotonic() < deadline:
            time.sleep(0.01)
        return passes(*args)

    update.logprob_passes = once_the_thread_has_the_step
    start = len(compiles)
    state, metrics = update(state, batch)
    made = compiles[start:]
    assert sorted(name for name, _ in made) == ["jit(compute)", "jit(step)"], made
    assert [thread for name, thread in made if name == "jit(step)"][0].startswith("spiral-jax-compile")
    start = len(compiles)
    state, metrics = update(state, batch)
    assert compiles[start:] == [], "a batch of the same shape compiled again"

    plain, want = make_update(TINY, tc, mesh), _state(host_params, tc, mesh)
    for _ in range(2):
        want, want_metrics = plain(want, batch)
    for got, expected in zip(jax.tree.leaves(state.params), jax.tree.leaves(want.params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-7)
    assert [float(m["loss"]) for m in metrics] == pytest.approx([float(m["loss"]) for m in want_metrics], abs=1e-6)


def test_reshard_hands_the_same_values_to_the_sample_layout(host_params):
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    params = _state(host_params, mesh=mesh).params
    sample = make_reshard(TINY, mesh)(params)
    for got, want, s in zip(jax.tree.leaves(sample), jax.tree.leaves(host_params),
                            jax.tree.leaves(param_shardings(TINY, Rules.create(mesh, "sample")))):
        assert got.sharding.is_equivalent_to(s, got.ndim)
        np.testing.assert_array_equal(np.asarray(got), want)
    # Without fsdp the two layouts agree: the sampler reads the trainer's arrays as they are.
    assert make_reshard(TINY, make_mesh(data=4, fsdp=1, tensor=2))(params) is params
    assert make_reshard(TINY, None)(params) is params


def test_merged_lora_for_a_gpu_is_a_per_layer_list_with_the_same_logits():
    """Merged for a GPU, the scanned model's adapters fold into a per-layer list (a scanned decode step on
    GPU copies each layer out of the stack): placed on the sample layout, the same logits."""
    cfg = TINY.replace(lora_rank=4, scan_layers=True)
    full = init_params(cfg, jax.random.key(1))
    full = jax.tree.map(lambda x: x + 0.05 if x.ndim > 1 else x, full)  # adapters with B != 0
    frozen, adapters = split_frozen(cfg, full, None)
    ids = np.arange(24, dtype=np.int32).reshape(2, 12) % TINY.vocab_size
    want = forward(make_policy(cfg, None)(adapters, frozen), sample_config(cfg, True), ids)
    assert sample_config(cfg, True).scan_layers
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    with cpu.compiling_for("gpu"):
        sample_cfg = sample_config(cfg, True)
        policy = make_reshard(sample_cfg, mesh)(make_policy(cfg, mesh)(adapters, frozen))
    assert not sample_cfg.scan_layers and not sample_cfg.lora_rank
    assert isinstance(policy["layers"], list) and len(policy["layers"]) == cfg.num_layers
    np.testing.assert_allclose(forward(policy, sample_cfg, ids), want, atol=1e-5)


def test_schedule_and_config_checks():
    lr = make_schedule(TrainConfig(learning_rate=1.0, schedule="cosine", warmup_steps=10, decay_steps=100,
                                   final_lr_fraction=0.1))
    assert [float(lr(s)) for s in (0, 5, 10, 110)] == pytest.approx([0.0, 0.5, 1.0, 0.1])
    assert float(make_schedule(TrainConfig())(1000)) == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="decay_steps"):
        TrainConfig(schedule="linear")
    with pytest.raises(ValueError, match="normaliser"):
        TrainConfig(normaliser="sum")
    with pytest.raises(ValueError, match="micro-batches"):
        make_train_step(TINY, TC)(_state({}), pack(random_samples(3), row_multiple=3))
