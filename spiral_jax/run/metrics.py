"""The scalars one training step logs: its games, its samples, where its time went, the throughput,
running totals, the update's own metrics and RAE's baselines (names as in TensorBoard)."""
from __future__ import annotations

import dataclasses

import jax

from spiral_jax.eval.games import summarize
from spiral_jax.rl.rae import baseline_metrics
from spiral_jax.rl.step_metrics import step_metrics
from spiral_jax.run.collect import Collected


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Seconds of one step: all of it, handing the weights to the sampler, playing the games (sampling
    and the games' host-side work) and the update."""
    step: float
    handover: float
    rollout: float
    update: float


def peak_memory() -> dict[str, float]:
    """Peak bytes in use on this host's first device, in GiB, where the backend reports it (GPU, TPU)."""
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" not in stats:
        return {}
    return {"memory/peak_gib": stats["peak_bytes_in_use"] / 2**30}


def trained_tokens(collected: Collected) -> int:
    return sum(len(x.prompt_ids) + len(x.response_ids) for x in collected.samples)


def step_scalars(collected: Collected, trained: int, update: dict, times: StepTimes, totals: dict, rae: dict,
                 new_executables: int) -> dict[str, float]:
    """Everything a step logs, from its collected data (`trained` tokens of it went into the update),
    the update's metrics and its timings."""
    games, samples, decode = collected.games, collected.samples, collected.decode
    metrics = {f"train/{k}": float(v) for k, v in update.items()}
    overall = summarize(games)
    metrics.update(overall.scalars("rollout/all"))
    for env_id in sorted(set(g.record.env_id for g in games)):
        metrics.update(summarize([g for g in games if g.record.env_id == env_id]).scalars(f"rollout/{env_id}"))
    metrics.update({
        "rollout/truncation_rate": overall.truncated_responses,
        "rollout/games": len(games), "rollout/samples": len(samples),
        "rollout/samples_before_selection": collected.candidates,
        "rollout/zero_advantage_dropped": collected.zero_dropped,
        "time/step": times.step, "time/sampling": decode.seconds,
        "time/env": times.rollout - decode.seconds, "time/update": times.update, "time/handover": times.handover,
        "throughput/sampled_tokens_per_s": decode.tokens_per_s,
        # Decode slots doing useful work, and the share of prompt tokens whose keys were reused.
        "rollout/slot_utilization": decode.slot_utilization,
        "rollout/prefill_saved": decode.prefill_saved,
        # Nonzero after the first steps means a shape is not bucketed and a program recompiles.
        "compile/new_executables": new_executables,
        "throughput/trained_tokens_per_s": trained / max(times.update, 1e-9),
        "throughput/games_per_s": len(games) / max(times.rollout, 1e-9),
        **{f"totals/{k}": float(v) for k, v in totals.items()},
    })
    metrics.update(step_metrics(games, samples))
    metrics.update(peak_memory())
    metrics.update(baseline_metrics(rae))
    return metrics
