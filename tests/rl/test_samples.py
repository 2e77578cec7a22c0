"""Packing turn samples: right-padded rows, several samples to a row, loss on the response tokens only,
quarter-octave buckets."""
import jax
import numpy as np
import pytest

from spiral_jax.rl.samples import (PACKED_PER_ROW, TurnSample, bucket_length, pack, padded_rows, per_row, row_multiple,
                                   shard_batch)
from tests.tiny_models import TINY
from spiral_jax.sharding import make_mesh


def _sample(prompt, response, adv=1.0):
    return TurnSample(prompt, response, [-0.5 - i for i in range(len(response))], "g", 0, 0, adv)


def test_pack_layout():
    stop = 9
    batch = pack([_sample([1, 2, 3], [4, 5, stop], adv=0.5), _sample([6], [stop], adv=-1.0)],
                 rows=4, min_length=8)
    assert batch.shape == (4, 8)
    np.testing.assert_array_equal(batch.tokens[0], [1, 2, 3, 4, 5, stop, 0, 0])
    np.testing.assert_array_equal(batch.targets[0], [2, 3, 4, 5, stop, 0, 0, 0])
    # Slots 2..4 predict the response 4, 5 and the stop token; the prompt is never a target.
    np.testing.assert_array_equal(batch.loss_mask[0], [0, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(batch.sampler_logprobs[0], [0, 0, -0.5, -1.5, -2.5, 0, 0, 0])
    np.testing.assert_array_equal(batch.segment_ids[0], [1, 1, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(batch.loss_mask[1], [1, 0, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(batch.targets[1, :1], [stop])
    np.testing.assert_array_equal(batch.positions[0], [0, 1, 2, 3, 4, 5, 0, 0])
    np.testing.assert_array_equal(batch.advantages, [[0.5], [-1.0], [0.0], [0.0]])
    # Padding rows carry nothing: no tokens, no loss, no advantage.
    for field in ("tokens", "segment_ids", "loss_mask", "sampler_logprobs", "old_logprobs", "ref_logprobs"):
        assert not getattr(batch, field)[2:].any(), field
    assert batch.tokens.dtype == np.int32 and batch.loss_mask.dtype == np.float32


def test_packed_rows_hold_several_samples_each_with_its_own_positions():
    stop = 9
    samples = [_sample([1, 2, 3], [4, stop], adv=0.5), _sample([6], [stop], adv=-1.0),
               _sample([7, 8], [5, 5, stop], adv=2.0)]
    batch = pack(samples, samples_per_row=4, min_length=8)
    # First fit, longest first: the two 5-token samples cannot share 8 slots, so row 0 holds sample 0
    # and then the 2-token sample 1, and row 1 sample 2.
    assert batch.shape == (2, 8) and batch.segments == 2
    np.testing.assert_array_equal(batch.tokens[0], [1, 2, 3, 4, stop, 6, stop, 0])
    np.testing.assert_array_equal(batch.segment_ids[0], [1, 1, 1, 1, 1, 2, 2, 0])
    np.testing.assert_array_equal(batch.positions[0], [0, 1, 2, 3, 4, 0, 1, 0])
    # Slot 4 (sample 0's stop token) would predict sample 1's first token: never a target of the loss.
    np.testing.assert_array_equal(batch.loss_mask[0], [0, 0, 1, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(batch.sampler_logprobs[0], [0, 0, -0.5, -1.5, 0, -0.5, 0, 0])
    np.testing.assert_array_equal(batch.response_slots, [[2, 3, 5, 7], [1, 2, 3, 7]])  # unused: the last slot
    np.testing.assert_array_equal(batch.advantages, [[0.5, -1.0], [2.0, 0.0]])
    np.testing.assert_array_equal(batch.tokens[1, :5], [7, 8, 5, 5, stop])
    assert batch.loss_mask.sum() == sum(len(s.response_ids) for s in samples)
    # At most samples_per_row to a row, and one a row by default, in the samples' order.
    assert pack([_sample([1], [stop])] * 5, samples_per_row=2).shape[0] == 3
    np.testing.assert_array_equal(pack(samples, min_length=8).advantages[:, 0], [0.5, -1.0, 2.0])
    # bucket_rows pads packed rows to quarter octaves.
    assert pack([_sample([1] * 7, [stop])] * 9, samples_per_row=2, bucket_rows=True).shape == (5, 16)
    assert pack([_sample([1] * 7, [stop])] * 33, samples_per_row=1, bucket_rows=True).shape[0] == 64
    # A packed row's response slots are bucketed, but never more than the row's slots.
    assert pack([_sample([1], [2] * 9)] * 2, samples_per_row=2, min_length=20).response_slots.shape == (1, 20)
    with pytest.raises(ValueError, match="samples_per_row=0"):
        pack(samples, samples_per_row=0)


def test_the_trainer_packs_rows_where_the_attention_kernel_takes_them():
    """Auto: packed on CPU (XLA's attention) and TPU (splash), one a row under cuDNN (bf16 on a GPU,
    whose packed layout needs a Hopper card); a setting always wins."""
    bf16 = TINY.replace(compute_dtype="bfloat16", head_dim=128)
    assert per_row(None, TINY, "cpu") == per_row(None, bf16, "tpu") == PACKED_PER_ROW > 1
    assert per_row(None, bf16, "gpu") == 1
    assert per_row(None, TINY, "gpu") == per_row(None, bf16.replace(attention="xla"), "gpu") == PACKED_PER_ROW
    assert per_row(4, bf16, "gpu") == 4 and per_row(1, TINY, "cpu") == 1


@pytest.mark.parametrize("n, pow2, quarter", [(2, 16, 16), (16, 16, 16), (17, 32, 20), (65, 128, 80),
                                              (100, 128, 112), (128, 128, 128), (4097, 8192, 5120)])
def test_length_buckets(n, pow2, quarter):
    """Sampler shapes: powers of two; packed training rows: quarter octaves."""
    assert bucket_length(n) == pow2
    assert bucket_length(n, per_octave=4) == quarter
    assert pack([_sample([1] * (n - 1), [2])]).shape[1] == quarter


def test_row_padding_and_limits():
    samples = [_sample([1, 2], [3])] * 5
    assert pack(samples).shape[0] == 5
    assert pack(samples, row_multiple=4).shape[0] == 8
    assert pack(samples, rows=12, row_multiple=4).shape[0] == 12
    with pytest.raises(ValueError, match="rows=4 must hold 5 rows"):
        pack(samples, rows=4)
    with pytest.raises(ValueError, match="multiple of row_multiple=4"):
        pack(samples, rows=6, row_multiple=4)
    with pytest.raises(ValueError, match="max_length=16"):
        pack([_sample([1] * 20, [2])], max_length=16)
    with pytest.raises(ValueError, match="sampler log-probs"):
        TurnSample([1], [2, 3], [0.0], "g", 0, 0)
    with pytest.raises(ValueError, match="empty"):
        TurnSample([1], [], [], "g", 0, 0)


def test_shard_batch_splits_rows_over_data_and_fsdp():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    batch = shard_batch(pack([_sample([1, 2], [3])] * 3, row_multiple=4), mesh)
    for x in batch:
        assert x.sharding.spec[0] == ("data", "fsdp")
        assert {s.data.shape[0] for s in x.addressable_shards} == {1}
    assert isinstance(shard_batch(pack([_sample([1], [2])]), None).tokens, jax.Array)


def test_the_micro_batch_rule_of_the_trainer_and_the_planner():
    """Rows come in micro-batches (default one row per data x fsdp shard) that split over the shards
    and, for an exact selection, divide the step's samples; a step of any size pads to few shapes."""
    assert row_multiple(None, 8, 128) == 8 and row_multiple(16, 8, 128) == 16 and row_multiple(16, 8) == 16
    with pytest.raises(ValueError, match=r"micro_batch_size=12 must be a multiple of .* \(8\) and divide "
                                         r"rollout.samples_per_step=128"):
        row_multiple(12, 8, 128)
    with pytest.raises(ValueError, match=r"micro_batch_size=48 .* divide rollout.samples_per_step=128"):
        row_multiple(48, 8, 128)
    with pytest.raises(ValueError, match=r"\(8\)$"):
        row_multiple(12, 8)
    assert [padded_rows(n, 8) for n in (1, 8, 9, 100)] == [8, 8, 16, 128]
    assert [padded_rows(n, 8, per_octave=4) for n in (1, 9, 33, 100)] == [8, 16, 40, 112]
