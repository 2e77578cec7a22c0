"""The estimate: per-device bytes of every part a run keeps or builds, and the peak of each phase of a
step (train step, old log-probs, each sampler call) against the device's memory."""
from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spiral_jax.hardware import HEADROOM, GiB, MiB, Hardware
from spiral_jax.models import ModelConfig
from spiral_jax.plan import arrays
from spiral_jax.plan.activations import (activations, fused, logprob_pass, micro_batch_gradients, sampling,
                                         weights_in_flight)
from spiral_jax.plan.sizes import MeshShape, Workload, workload
from spiral_jax.rl.samples import row_multiple
from spiral_jax.sampling import bucket_length
from spiral_jax.sampling.buckets import insert_rows
from spiral_jax.sharding import MeshError


@dataclasses.dataclass
class Plan:
    """Per-device bytes of each part and the peak of each phase, against the hardware."""

    hardware: Hardware
    mesh: MeshShape
    cfg: ModelConfig
    work: Workload
    parts: dict[str, int]
    phases: dict[str, int]
    labels: dict[str, str]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def worst_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    @property
    def fits(self) -> bool | None:
        limit = self.hardware.limit
        return None if limit is None else self.peak <= limit

    def table(self) -> str:
        unit, name = (GiB, "GiB") if self.peak >= GiB else (MiB, "MiB")
        n = self.cfg.num_params
        count = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
        cfg, w, hw = self.cfg, self.work, self.hardware
        dp = self.mesh.batch_shards
        rollout = w.sampler_calls(hw.hosts)[0][1]  # on one host
        per_device = w.micro_batch // dp if w.micro_batch % dp == 0 else w.micro_batch
        width = max(len(x) for x in [*self.labels.values(), *self.phases]) + 2
        lines = [
            f"hardware: {hw.name}: {hw.devices} devices" + (
                f" x {hw.memory / GiB:.1f} GiB ({hw.usable:.0%} usable)" if hw.memory else
                ", memory per device unknown (pass --hardware, or --device_memory_gib)"),
            f"model: {cfg.model_type}, {count} parameters ({cfg.num_layers} layers, "
            f"hidden {cfg.hidden_size}, vocab {cfg.vocab_size}), compute {cfg.compute_dtype}, "
            f"{cfg.remat_summary}, scan_layers {'on' if cfg.scan_layers else 'off'}",
            f"mesh: {self.mesh}; micro-batch {w.micro_batch} row(s), {per_device} per device, x {w.train_len}"
            f" slots (response {w.response_len}, logprob chunk {w.chunk})",
            f"sampling: prompt bucket {w.prompt_len}; rollout "
            f"{f'a decode engine of {rollout} slots' if w.continuous else f'{rollout} games per call'}; eval "
            f"{w.eval_games}, final eval {w.final_games} games, {w.eval_in_flight or 'all'} at a time",
            "", f"{'per device':<{width + 2}}{name:>9}"]
        lines += [f"  {self.labels[k]:<{width}}{v / unit:9.2f}" for k, v in self.parts.items()]
        lines += ["", f"{'peak per phase':<{width + 2}}{name:>9}"]
        lines += [f"  {k:<{width}}{v / unit:9.2f}" for k, v in self.phases.items()]
        lines.append("")
        if self.fits is None:
            lines.append(f"peak: {self.peak / unit:.2f} {name} per device ({self.worst_phase}); no memory "
                         f"limit known for these devices")
        else:
            usable = hw.memory * hw.usable
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"peak: {self.peak / unit:.2f} {name} per device ({self.worst_phase}) of "
                         f"{usable / unit:.2f} {name} usable = {self.peak / usable:.0%}: {verdict} "
                         f"(limit {self.hardware.limit / unit:.2f} {name}, {HEADROOM:.0%} headroom)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def sampler_mesh(mesh: MeshShape, hw: Hardware) -> MeshShape:
    """The mesh the sampler runs on: on several hosts each samples on its own devices
    (`distributed.host_local_mesh`: data 1, the host's tensor groups on fsdp), else the run's mesh."""
    if hw.hosts <= 1:
        return mesh
    return MeshShape(1, hw.devices_per_host // mesh.tensor, mesh.tensor)


def sampler_call(cfg: ModelConfig, work: Workload, mesh: MeshShape, hw: Hardware, games: int, new: int,
                 engines: int = 1) -> tuple[int, int]:
    """(KV caches, transients) per device of one sampler call of `games` games on one host, or of
    `engines` decode engines of `games` slots each (continuous schedule): every engine holds its own
    cache through the call, and they insert one after another, so one insert's transients at a time."""
    cache, prefill = sampling(cfg, work, sampler_mesh(mesh, hw), games, new, fused(cfg, hw))
    return engines * cache, prefill


def estimate(cfg: ModelConfig, tc, work: Workload, mesh: MeshShape, hw: Hardware) -> Plan:
    """Per-device bytes of a run with this model, optimizer, workload and mesh on `hw`."""
    params, sample_params = arrays.param_bytes(cfg, mesh, "train"), arrays.param_bytes(cfg, mesh, "sample")
    same_layout, kernel = arrays.same_layout(cfg, mesh), fused(cfg, hw)
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    lora_on, merged = bool(cfg.lora_rank), work.lora_merged
    # With LoRA the sampler, the pool and the frozen opponent read merged weights in the compute dtype,
    # or (lora.sample = "adapters") the frozen weights themselves, with the adapters beside them: the
    # train state's frozen arrays where the layouts agree, else a copy of them on the sample layout
    # (`make_reshard` moves every leaf of the policy it is given).
    frozen_sample = arrays.frozen_bytes(cfg, mesh, "sample") if lora_on and not merged else 0
    policy_bytes = arrays.merged_bytes(cfg, mesh) if lora_on and merged else \
        sample_params + (0 if same_layout else frozen_sample)
    # A frozen opponent is a model folder loaded on its own: with adapters applied in the forward, its
    # frozen weights are never the train state's.
    opponent_bytes = policy_bytes + (frozen_sample if same_layout else 0)
    parts = {
        "frozen": arrays.frozen_bytes(cfg, mesh),
        "params": params,
        "optimizer": arrays.optimizer_bytes(cfg, tc, mesh),
        "sampler_params": policy_bytes if (lora_on and merged) or not same_layout else 0,
        "snapshots": (work.snapshots - work.frozen_opponent) * policy_bytes + work.frozen_opponent * opponent_bytes,
        "kl_reference": params if tc.kl_coef else 0,
        "gradients": params + micro_batch_gradients(cfg, mesh, hw, params),
        "weights_in_flight": weights_in_flight(cfg, mesh),
        "activations": activations(cfg, tc, work, mesh, kernel, hw.platform),
        "logprob_pass": logprob_pass(cfg, tc, work, mesh, kernel) if not tc.on_policy or tc.kl_coef else 0,
        # A forward without gradients (sampling, old log-probs) casts every weight to the compute
        # dtype once, outside its loops: the TPU compiler hoists the casts, holding a whole copy.
        # LoRA's weights and its merged copy are in the compute dtype already.
        "weights_cast": 0 if cb == 4 or lora_on else sample_params * cb // 4,
    }
    labels = {
        "frozen": f"frozen weights beside the LoRA adapters ({cfg.compute_dtype}, train layout)",
        "params": "LoRA adapters (fp32, train layout)" if lora_on else "parameters (fp32, train layout)",
        "optimizer": "optimizer state (AdamW mu + nu, fp32)",
        "sampler_params": ("the merged weights the sampler reads (sample layout)" if lora_on and merged else
                           "the sampler's copy of the frozen weights and adapters (sample layout)" if lora_on else
                           "sampler's copy of the parameters (sample layout)"),
        "snapshots": f"opponent weights ({work.snapshots}: pool or frozen, sample layout)",
        "kl_reference": "the KL penalty's frozen reference policy (train layout)",
        "gradients": ("gradients: one micro-batch's + the fp32 accumulator"
                      if parts["gradients"] == 2 * params else "gradients: the fp32 accumulator + the table's and 2 layers'"),
        "weights_in_flight": "weights all-gathered/cast for compute, their grads",
        "activations": f"activations of one micro-batch ({cfg.remat_summary}"
                       f"{', fused attention' if kernel else ''})",
        "logprob_pass": "PPO's old-log-prob pass: the batch and one micro-batch's forward",
        "weights_cast": f"weights cast to {cfg.compute_dtype} for sampling and old log-probs",
    }
    resident = (parts["frozen"] + parts["params"] + parts["optimizer"] + parts["sampler_params"]
                + parts["snapshots"] + parts["kl_reference"])
    phases = {"train step": resident + parts["gradients"] + parts["weights_in_flight"] + parts["activations"]}
    if parts["logprob_pass"]:
        phases["old log-probs"] = resident + (parts["weights_cast"] or parts["weights_in_flight"] // 2) \
            + parts["logprob_pass"]
    calls = {}  # (games, new-token bucket, engines) -> the phases that make such a sampler call
    for name, games, new, engines in work.sampler_calls(hw.hosts):
        if games > 0:
            calls.setdefault((games, bucket_length(new, 1), engines), []).append(name)
    for (games, new, engines), names in calls.items():
        name = ", ".join(names)
        cache, prefill = sampler_call(cfg, work, mesh, hw, games, new, engines)
        parts[f"kv {name}"], parts[f"prefill {name}"] = cache, prefill
        if work.continuous:
            engine = f"a decode engine of {games} slots" if engines == 1 else \
                f"{engines} decode engines (one per policy) of {games} slots"
            labels[f"kv {name}"] = f"KV cache, {name}: {engine} x {work.prompt_len + new}"
            labels[f"prefill {name}"] = (f"an insert's transients ({insert_rows(games)} slots' prompts over the "
                                         f"cache), {name}")
        else:
            labels[f"kv {name}"] = f"KV cache, {name}: {games} games x {work.prompt_len + new} slots"
            labels[f"prefill {name}"] = f"prefill transients, {name}"
        phases[f"{name} ({games} games at once)"] = resident + parts["weights_cast"] + cache + prefill
    if not work.snapshots:
        del parts["snapshots"]
    if not tc.kl_coef:
        del parts["kl_reference"]
    for name in ("logprob_pass", "weights_cast", "frozen") + (("sampler_params",) if lora_on else ()):
        if not parts[name]:
            del parts[name]
    notes = []
    if lora_on:
        notes.append(f"LoRA rank {cfg.lora_rank} on {','.join(cfg.lora_targets)}: the weights are frozen in "
                     f"{cfg.compute_dtype}; the sampler reads " + ("a copy with the adapters merged in, once per "
                     "step (model.lora.sample=adapters saves that copy)" if merged else
                     "them and applies the adapters in its forward (no merged copy)"))
        if not merged and cfg.scan_layers and hw.platform == "gpu":
            notes.append("on a GPU the sampler's products copy the frozen weights out of their stack every "
                         "decode step (about 2.7x the step's memory traffic): set --config.model.scan_layers=False "
                         "to hold them per layer (docs/performance.md)")
    elif same_layout:
        notes.append("train and sample layouts agree (fsdp 1): the sampler reads the train state, no copy")
    return Plan(hw, mesh, cfg, work, parts, phases, labels, notes)


def check_hosts(mesh: MeshShape, hw: Hardware) -> None:
    """Raise MeshError where a tensor group would span hosts: each host samples on its own devices
    (`distributed.host_local_mesh`), so mesh.tensor must divide the devices per host."""
    if hw.hosts > 1 and hw.devices_per_host % mesh.tensor:
        raise MeshError(f"mesh.tensor={mesh.tensor} splits tensor groups across the {hw.hosts} hosts of {hw.name} "
                        f"({hw.devices_per_host} devices each), and each host samples on its own devices; use a "
                        f"tensor size that divides {hw.devices_per_host} (and raise mesh.fsdp to match)")


def plan(spec, hw: Hardware, mesh: MeshShape | None = None) -> Plan:
    """The plan of a run (`RunSpec`) on `hw` (its own mesh unless `mesh` is given)."""
    mesh = mesh or MeshShape.resolve(spec.mesh["data"], spec.mesh["fsdp"], spec.mesh["tensor"], hw.devices)
    check_hosts(mesh, hw)
    work = workload(spec)
    result = estimate(spec.model, spec.train, work, mesh, hw)
    notes = [f"model shape from {spec.model_source}"] + ([f"hardware: {hw.source}"] if hw.source else [])
    try:
        row_multiple(spec.train.micro_batch_size, mesh.batch_shards, work.samples)
    except ValueError as e:
        notes.append(f"{e}: the trainer refuses this config")
    chunked = [f"{name} ({n} games)" for name, n in (("eval", work.eval_games), ("final eval", work.final_games))
               if n > work.in_flight(n)]
    if hw.hosts > 1:
        notes.append(f"sampling planned for one of the {hw.hosts} hosts: its share of the games on its own "
                     f"{hw.devices_per_host} devices (mesh {sampler_mesh(mesh, hw)})")
    if chunked:
        notes.append(f"{' and '.join(chunked)} play at most {work.eval_in_flight} games at once per host "
                     f"({'rollout.max_in_flight' if spec.rollout.max_in_flight else 'rollout.games_per_batch'}): "
                     "more evaluation games take longer, not more memory")
    if spec.bootstrap and not spec.model_path:
        notes.append("not planned: the imitation bootstrap (tiny random models only; its own Adam state)")
    result.notes[:0] = notes
    return result


