"""How a decoded row ends, for every decode program and its host side alike.

On the device, `row_stops` says which rows stop at the token just sampled: a stop id, or the row's
new-token limit, and `finished_sees_first` narrows a finished row's attention to one slot. On the
host, `finish_reason` names why a finished row ended and `check_finite` refuses rows whose logits
were NaN or infinite.
"""
from __future__ import annotations

from typing import Collection, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def row_stops(tokens: jax.Array, generated, max_new, stop_ids) -> jax.Array:
    """[B] bool: the rows that stop at tokens [B], their `generated`-th new token: a stop id (stop_ids:
    int32, -1 padded; -1 matches no token), or the `max_new` limit reached. generated and max_new:
    scalars or [B]."""
    stop = jnp.any(tokens[:, None] == jnp.asarray(stop_ids)[None, :], axis=-1)
    return stop | (generated >= max_new)


def finished_sees_first(kv_mask: jax.Array, done: jax.Array) -> jax.Array:
    """A decode step's kv_mask [B, S] with each finished row (done [B]) seeing its first slot only. A
    finished row still runs through the step, but nobody reads its output: the Pallas decode kernels
    (models/decode_attention.py) then read one block of its cache instead of all it filled, while
    XLA's attention reads the same either way."""
    return jnp.where(done[:, None], jnp.arange(kv_mask.shape[1])[None, :] == 0, kv_mask)


def finish_reason(tokens: Sequence[int], stop_ids: Collection[int], cancelled: bool = False) -> str:
    """Why a finished row ended: "cancelled" (by its caller), "stop" (its last token is a stop id) or
    "length" (its new-token limit)."""
    if cancelled:
        return "cancelled"
    return "stop" if len(tokens) > 0 and tokens[-1] in stop_ids else "length"


def check_finite(raw_logprobs: np.ndarray, lengths: np.ndarray) -> None:
    """Raise a FloatingPointError if a row's log-probs [rows, budget], within its first `lengths`
    tokens, are NaN or infinite: non-finite logits would otherwise come back as tokens past the
    vocabulary with NaN log-probs."""
    bad = ~np.isfinite(raw_logprobs) & (np.arange(raw_logprobs.shape[1]) < lengths[:, None])
    if bad.any():
        row, step = np.argwhere(bad)[0]
        raise FloatingPointError(
            f"the model's logits are NaN or infinite (prompt {row}, new token {step}): the parameters hold "
            f"NaN/inf values or overflow the compute dtype; check the checkpoint, or the update that "
            f"produced these parameters")
