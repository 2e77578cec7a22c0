"""The memory planner: what a run needs per device, from its RunSpec alone (no weights, no devices).

`spiral-jax plan --config C --hardware v5p-8` answers "will this run fit?" before a slice is booked.
It prints, per device, the bytes of everything the trainer keeps or builds, and the peak of each
phase of a step against the device's memory:

- train step: parameters + Adam state + the sampler's copy (still referenced) + the KL reference
  (with optim.kl_coef) + gradients (one micro-batch's, plus the fp32 accumulator) + weights
  all-gathered for compute + activations;
- rollout / evaluation: parameters + Adam state + the sampler's copy + the KV cache of one
  `Sampler.generate` call + the prefill's transients. Rollout plays `rollout.games_per_batch` games
  in one call; evaluation (the trainer's periodic and final evals, `spiral-jax eval`) plays its games
  in chunks of at most `rollout.games_per_batch` per host (`Rollout.max_in_flight`), so its call is
  min(games, games_per_batch) games at `eval.max_new_tokens`: more evaluation games cost time, not
  memory.

Every array the run allocates is counted exactly, from the shapes and dtypes of the code that
allocates it, divided by the shardings `Rules.spec` gives it (`plan.arrays`): parameters, optimizer
state, the sampler's copy, the KV cache, the packed batch, and what the sampler, the train step and
the old-log-prob pass return per slot. XLA's temporaries (activations, all-gathered weights, prefill
transients) are a model fitted on XLA:CPU (`plan.activations`). `plan.estimator` adds the parts into
the peak of each phase; when that does not fit, `plan.search` looks for a mesh over the same devices,
a smaller micro-batch and fewer games per sampler call (`rollout.games_per_batch`, which also bounds
evaluation's) with the same estimator.

Sampling is planned for one host (`Workload.sampler_calls`): on a slice of several hosts each plays
its share of the games on its own devices (`distributed.host_local_mesh`: data 1, its tensor groups
on fsdp), so the KV cache and prefill are sized on that mesh, and mesh.tensor must divide the devices
per host (`Hardware.hosts`; `plan` refuses other meshes, the search skips them). Under the continuous
schedule every LLM policy a call seats has a decode engine, and so a KV cache, of its own.
"""
from spiral_jax.hardware import GiB, MiB
from spiral_jax.plan.activations import fused
from spiral_jax.plan.estimator import Plan, estimate, plan
from spiral_jax.plan.search import meshes, report, suggest
from spiral_jax.plan.sizes import MeshShape, Workload, longest_row, shard_elements, workload

__all__ = ["GiB", "MiB", "MeshShape", "Plan", "Workload", "estimate", "fused", "longest_row", "meshes",
           "plan", "report", "shard_elements", "suggest", "workload"]
