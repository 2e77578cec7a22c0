"""When a run does not fit: the search for a mesh, micro-batch and games per sampler call that do, by
the same estimator, and the printed report with its warning and suggestion."""
from __future__ import annotations

import dataclasses
import functools
import itertools

from spiral_jax.hardware import GiB, Hardware
from spiral_jax.plan.estimator import Plan, estimate, plan, sampler_call
from spiral_jax.plan.sizes import MeshShape
from spiral_jax.sharding import MeshError


def meshes(devices: int, per_host: int | None = None):
    """Every (data, fsdp, tensor) whose sizes multiply to `devices`, with a tensor size that divides
    the devices of one host (`per_host`, default all of them): a tensor group never spans hosts
    (`distributed.host_local_mesh`)."""
    for data, fsdp in itertools.product(range(1, devices + 1), repeat=2):
        if devices % (data * fsdp) == 0 and (per_host or devices) % (devices // (data * fsdp)) == 0:
            yield MeshShape(data, fsdp, devices // (data * fsdp))


def _largest(candidates, ok) -> int | None:
    """The first (largest) candidate that `ok` accepts."""
    return next((x for x in candidates if ok(x)), None)


def _fewer(n: int) -> list[int]:
    """n, then the powers of two below it: the games per sampler call tried when n do not fit."""
    return [n] + [1 << k for k in range(n.bit_length() - 1, -1, -1) if 1 << k < n]


def suggest(spec, hw: Hardware, plan_now: Plan | None = None) -> tuple[str, Plan] | None:
    """The best setup that fits, by the same estimator: (what to change, its plan), or None.

    Searched on every mesh over the same devices whose tensor groups stay on one host (and with remat
    on): the largest micro-batch that divides the step's samples and is a multiple of data x fsdp (as
    the trainer requires) for the train step, and the largest games per sampler call (up to the
    configured ones: rollout.max_in_flight where set, else rollout.games_per_batch) whose sampler
    calls fit: the rollout's, and evaluation's chunks at eval.max_new_tokens (`Workload.sampler_calls`).
    The number of evaluation games is never changed: it costs time, not memory.
    The train step and the sampler calls share only the resident state, so each is sized on its own.
    Preferred: the largest micro-batch, then the most games per call (both change only speed), then
    the lowest peak.
    """
    if hw.limit is None:
        return None
    current = plan_now or plan(spec, hw)
    cfg, tc, work, limit = current.cfg, spec.train, current.work, hw.limit
    # The games per sampler call: rollout.max_in_flight where it is set (a step keeps its games), else
    # rollout.games_per_batch.
    knob = "max_in_flight" if work.max_in_flight else "games_per_batch"
    no_games = dict(games_per_batch=0, max_in_flight=0, eval_games=0, final_games=0)
    best, best_key = None, None
    for mesh, remat in itertools.product(meshes(hw.devices, hw.devices_per_host),
                                         (cfg.remat,) if cfg.remat else (False, True)):
        trial = functools.partial(estimate, cfg.replace(remat=remat), tc, mesh=mesh, hw=hw)
        base = trial(dataclasses.replace(work, **no_games))
        resident = base.phases["train step"] - sum(base.parts[k] for k in ("gradients", "weights_in_flight",
                                                                           "activations"))

        dp = mesh.batch_shards
        micro = [m for m in range(work.samples, 0, -1) if work.samples % m == 0 and m % dp == 0]

        def calls_fit(g, mesh=mesh, resident=resident, base=base):
            chunk = dataclasses.replace(work, **{knob: g})
            return all(resident + base.parts.get("weights_cast", 0) + sum(
                sampler_call(cfg, chunk, mesh, hw, games, new, engines)) <= limit
                for _, games, new, engines in chunk.sampler_calls(hw.hosts) if games > 0)

        sizes = dict(
            micro_batch=_largest(micro, lambda m: trial(dataclasses.replace(work, micro_batch=m, **no_games)).fits),
            games=_largest(_fewer(work.rollout_games), calls_fit))
        if any(v is None for v in sizes.values()):
            continue
        fit = trial(dataclasses.replace(work, micro_batch=sizes["micro_batch"], **{knob: sizes["games"]}))
        key = (sizes["micro_batch"], sizes["games"], -fit.peak)
        if fit.fits and (best_key is None or key > best_key):
            best, best_key = fit, key
    if best is None:
        return None
    changes = []
    if best.mesh != current.mesh:
        changes.append(f"--config.mesh.data={best.mesh.data} --config.mesh.fsdp={best.mesh.fsdp} "
                       f"--config.mesh.tensor={best.mesh.tensor}")
    if best.cfg.remat != cfg.remat:
        changes.append("--config.model.remat=True")
    for field, key in (("micro_batch", "optim.micro_batch_size"), ("games_per_batch", "rollout.games_per_batch"),
                       ("max_in_flight", "rollout.max_in_flight")):
        if getattr(best.work, field) != getattr(work, field):
            changes.append(f"--config.{key}={getattr(best.work, field)}")
    return " ".join(changes), best


def _matching_mesh(spec, hw: Hardware) -> MeshShape:
    """A mesh over all of `hw`'s devices: the config's tensor size where these devices take it (it
    divides the devices of a host), else tensor 1; fsdp takes the rest."""
    tensor = spec.mesh["tensor"]
    if not (isinstance(tensor, int) and tensor >= 1 and hw.devices_per_host % tensor == 0):
        tensor = 1
    return MeshShape(1, hw.devices // tensor, tensor)


def report(spec, hw: Hardware) -> tuple[str, bool | None]:
    """The printed plan (with a warning and a suggestion when it does not fit) and whether it fits."""
    text, mesh_error = [], None
    try:
        p = plan(spec, hw)
    except MeshError as e:  # the config's mesh is for other hardware: plan fsdp over all, then suggest
        mesh_error = e
        text.append(f"WARNING: {e}; planned with data=1 fsdp={hw.devices} tensor=1 instead\n")
        p = plan(spec, hw, MeshShape(1, hw.devices, 1))
    text.append(p.table())
    if p.fits is False or mesh_error:
        if p.fits is False:
            text.append(f"\nWARNING: this run needs {p.peak / GiB:.2f} GiB per device in its {p.worst_phase}, "
                        f"above the {hw.limit / GiB:.2f} GiB limit of {hw.name}; it would run out of memory.")
        found = suggest(spec, hw, p)
        if found is None and hw.limit is None:  # nothing to size against: a mesh these devices take
            m = _matching_mesh(spec, hw)
            text.append(f"Suggestion (a mesh over these {hw.devices} devices; memory per device unknown, so not "
                        f"checked: pass --hardware or --device_memory_gib to size it):\n"
                        f"  --config.mesh.data={m.data} --config.mesh.fsdp={m.fsdp} --config.mesh.tensor={m.tensor}")
        elif found is None:
            text.append("No mesh, micro-batch or number of games per sampler call fits on these devices: "
                        "use more devices or devices with more memory, or shorten max_prompt_len / "
                        "max_new_tokens.")
        else:
            change, better = found
            if mesh_error and "--config.mesh." not in change:
                m = better.mesh
                change = f"--config.mesh.data={m.data} --config.mesh.fsdp={m.fsdp} --config.mesh.tensor={m.tensor} " \
                         + change
            text.append(f"Suggestion (the planner's best fit: peak {better.peak / GiB:.2f} GiB per device, "
                        f"{better.peak / (hw.memory * hw.usable):.0%} of usable, in its {better.worst_phase}):"
                        f"\n  {change.strip()}")
            if better.work.rollout_games < p.work.rollout_games and (p.work.eval_games or p.work.final_games):
                knob = "max_in_flight" if p.work.max_in_flight else "games_per_batch"
                text.append(f"  (rollout.{knob} also bounds evaluation's games per sampler call; "
                            "eval.games and eval.final_games cost time, not memory)")
    return "\n".join(text), False if mesh_error else p.fits
