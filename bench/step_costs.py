"""What an RL step computes and reads, whatever the device: the model FLOPs of training passes, and the
bytes of weights and KV cache its decode steps read (the HBM floor's numerator)."""
import numpy as np

from spiral_jax.models import ModelConfig


def sample_sizes(segment_ids, loss_mask) -> list[tuple[int, int]]:
    """(tokens, response tokens) of each sample of a packed batch: its segments, row by row."""
    return [(int(np.sum(ids == j)), int(np.sum(loss[ids == j]))) for ids, loss in zip(segment_ids, loss_mask)
            for j in range(1, int(ids.max()) + 1)]


def train_flops(cfg: ModelConfig, samples, passes: int, attention: bool = True) -> float:
    """Model FLOPs of `passes` (3: forward + backward, 1: forward) over samples of (tokens, response
    tokens); without `attention`, those of the weights' products alone. Attention counts each
    sample's own causal scores, which is all a packed row's kernel needs. With LoRA the backward
    computes no gradient of the frozen weights, so their products count one pass fewer (the
    adapters' own products are left out)."""
    unembed = cfg.vocab_size * cfg.hidden_size
    body = cfg.num_params - unembed * (1 if cfg.tie_word_embeddings else 2)
    scores = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * attention  # x n(n+1) per sample, causal
    weight_passes = passes - (passes == 3 and cfg.lora_rank > 0)
    return sum(weight_passes * (2 * body * n + 2 * unembed * r) + passes * scores * n * (n + 1) for n, r in samples)


def read_sizes(cfg: ModelConfig, itemsize: int) -> tuple[int, int]:
    """Bytes a decode step reads for the weights, and for each cache slot-token (keys and values)."""
    return cfg.num_params * itemsize, 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize


def cache_read(rows: int, prompt_bucket: int, steps: int) -> float:
    """Slot-tokens of cache that `steps` decode steps of `rows` rows read: each row its prompt bucket
    and the tokens so far, every step."""
    return rows * (steps * prompt_bucket + steps * (steps + 1) / 2)


def window_read(rows: int, prompt_bucket: int, windows, steps: int) -> int:
    """Slot-tokens of cache that a sampler call's attention reads when every row reads its decode
    stage's whole window (`attention_windows`), as XLA's masked attention does: step s (tokens so far)
    runs in the first stage whose window holds slot prompt_bucket + s."""
    read, start = 0, 1
    for w in windows:
        end = min(w - prompt_bucket, steps)  # the last step this stage runs
        if end >= start:
            read += rows * w * (end - start + 1)
            start = end + 1
    return read


def decode_reads(schedule: str, probes) -> tuple[int, float, float, float, float]:
    """What the last rollout's decoding read, whatever the model: (decode steps, rows a step on average,
    slot-tokens of cache read over all steps, slot-tokens of the windows its programs read, seconds).
    The first: "rounds": each call's padded rows read their prompt bucket and tokens so far every step;
    "continuous": each engine call's live rows read the cache they filled (its idle slots are not
    counted). The second is what XLA's attention reads, masked slots included: every row of a call
    (padded rows, finished ones and an engine's idle slots too) its whole attention window, every step.
    The Pallas decode kernels (TPU's; a GPU's with model.decode_attention=pallas) read about the
    first: each live row up to its own slot, a finished row (an engine's idle slot) one block."""
    if schedule == "rounds":
        calls = probes.calls.calls
        read = sum(cache_read(k["rows"], k["prompt_bucket"], k["steps"]) for k in calls)
        windows = sum(window_read(k["rows"], k["prompt_bucket"], k["windows"], k["steps"]) for k in calls)
        seconds = sum(k["seconds"] - k.get("prefill", 0.0) for k in calls)
    else:
        calls = probes.engines.decodes
        read, seconds = sum(k["filled"] for k in calls), sum(k["seconds"] for k in calls)
        windows = sum(k["slots"] * k["window"] * k["steps"] for k in calls)
    steps = sum(k["steps"] for k in calls)
    return steps, sum(k["rows"] * k["steps"] for k in calls) / max(steps, 1), read, windows, seconds
