"""The memory planner: what a run needs per device, from the config alone (no weights, no devices).

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

Parameters, optimizer state, gradients, the sampler's copy and the KV cache are exact: the shapes of
`param_specs` (and of optax's state, by `jax.eval_shape`) divided by the shardings `Rules.spec` gives
them. Activations, all-gathered weights and prefill transients are a model: buffer counts per layer,
measured on XLA:CPU (tests/test_plan.py checks the estimate against the compiled programs). TPU and
GPU compilers fuse more, so there the estimate errs high. When it does not fit, `suggest` searches
meshes over the same devices, smaller micro-batches and fewer games per sampler call
(`rollout.games_per_batch`, which also bounds evaluation's) with the same estimator. The planner
plans one host: with several, each host's evaluation still plays up to games_per_batch at once.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AbstractMesh

from spiral_jax.models import ModelConfig, abstract_params, lora, param_specs
from spiral_jax.models.fused_attention import resolve as resolve_attention
from spiral_jax.models.params import is_spec
from spiral_jax.models.transformer import CACHE_AXES
from spiral_jax.sampling import batch_bucket, bucket_length, cache_slots
from spiral_jax.hardware import HEADROOM, GiB, MiB, Hardware
from spiral_jax.sharding import MESH_AXES, RULE_SETS, MeshError, Rules, mesh_sizes

@dataclasses.dataclass(frozen=True)
class MeshShape:
    """A ('data', 'fsdp', 'tensor') mesh as sizes only: the arithmetic of `make_mesh`, no devices."""

    data: int
    fsdp: int
    tensor: int

    @classmethod
    def resolve(cls, data: int, fsdp: int, tensor: int, devices: int) -> "MeshShape":
        return cls(*mesh_sizes(data, fsdp, tensor, devices))

    @property
    def batch_shards(self) -> int:
        return self.data * self.fsdp

    def rules(self, kind: str) -> Rules:
        """The project's sharding rules on an abstract mesh of these sizes (nothing is allocated)."""
        return Rules(AbstractMesh((self.data, self.fsdp, self.tensor), MESH_AXES), RULE_SETS[kind])

    def __str__(self):
        return f"data={self.data} fsdp={self.fsdp} tensor={self.tensor}"


def shard_elements(rules: Rules, axes, shape) -> int:
    """Elements of one device's shard of an array with these logical axes (`Rules.spec` decides)."""
    n = 1
    for size, entry in zip(shape, rules.spec(axes, shape)):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        n *= size // math.prod(rules.mesh.shape[a] for a in names)
    return n


@dataclasses.dataclass(frozen=True)
class Workload:
    """The sizes a step runs at, worst case (every bucket at its configured maximum)."""

    samples: int  # rows per update
    micro_batch: int  # rows per micro-batch
    train_len: int  # T: prompt + response slots, bucketed
    response_len: int  # R: response slots, bucketed
    row_bytes: int  # one packed training row on the device, every Batch field
    chunk: int  # response slots unembedded at a time
    prompt_len: int  # prompt bucket of the sampler
    rollout_games: int  # games per rollout call (or decode slots), and evaluation's chunk: games_per_batch
    # or rollout.max_in_flight where that is smaller
    rollout_new: int
    eval_games: int  # as configured; evaluation plays them `in_flight` at a time
    final_games: int
    eval_new: int
    snapshots: int  # other policies' weights kept on the devices: pool snapshots, a frozen opponent
    lora_merged: bool = True  # with LoRA: the sampler reads a merged copy of the weights (model.lora.sample)

    def in_flight(self, games: int) -> int:
        """Games of an evaluation of `games` in one sampler call: chunks of at most games_per_batch
        (`Rollout.max_in_flight`; 0 or unset would mean all at once)."""
        return min(games, self.rollout_games) if self.rollout_games > 0 else games


def longest_row(c):
    """The packed `Batch` of one training row of config `c` at its worst case: the longest prompt plus
    the longest response, laid out by `pack` itself, so its buckets and dtypes are the trainer's."""
    from spiral_jax.rl.samples import TurnSample, pack

    r = c.rollout
    return pack([TurnSample([0] * r.max_prompt_len, [0] * r.max_new_tokens, [0.0] * r.max_new_tokens, "plan", 0, 0)])


def workload(c) -> Workload:
    """Worst-case sizes of config `c` (see `longest_row`)."""
    r, e = c.rollout, c.eval
    row = longest_row(c)
    train_len, response_len = row.tokens.shape[1], row.response_slots.shape[1]
    samples = r.samples_per_step
    return Workload(
        samples=samples, micro_batch=c.optim.micro_batch_size or samples,
        train_len=train_len, response_len=response_len, row_bytes=sum(x.nbytes for x in row),
        chunk=min(c.optim.logprob_chunk, response_len), prompt_len=bucket_length(r.max_prompt_len),
        rollout_games=min(r.games_per_batch, r.max_in_flight or r.games_per_batch), rollout_new=r.max_new_tokens, eval_games=e.games,
        final_games=e.final_games, eval_new=e.max_new_tokens,
        snapshots=r.pool_size if r.mode == "pool" else
        int(r.mode == "fixed_opponent" and r.opponent not in ("random", "scripted")),
        lora_merged=c.model.lora.sample == "merged")


def model_config(c) -> tuple[ModelConfig, str]:
    """The architecture from model.path's config.json, else model.random (also for a preset whose
    model.path is not downloaded yet); and where it came from."""
    import copy

    from spiral_jax.run.setup import model_config as configured

    path = c.model.path
    if path and (Path(path) / "config.json").exists():
        return configured(c), f"{path}/config.json"
    if path:
        c = copy.deepcopy(c)
        c.model.path = ""
    return configured(c), "model.random" if not path else f"model.random (no config.json at {path!r})"


# ------------------------------------------------------------------------------------- estimate


def _split(n: int, ways: int) -> int:
    """Per-device size of a dimension the rules split `ways` ways (replicated when it does not divide)."""
    return n // ways if n % ways == 0 else n


def _shard_sizes(cfg: ModelConfig, mesh: MeshShape, kind: str) -> dict:
    """Elements per device of every parameter on the `kind` layout (a tree like the parameters)."""
    rules = mesh.rules(kind)
    return jax.tree.map(lambda s: shard_elements(rules, s.axes, s.shape), param_specs(cfg), is_leaf=is_spec)


@functools.lru_cache(maxsize=256)
def _param_bytes(cfg: ModelConfig, mesh: MeshShape, kind: str) -> int:
    """fp32 parameter bytes per device on the `kind` layout (parameters are fp32 masters): with LoRA,
    the adapters' alone (the weights beside them are counted by `_frozen_bytes`)."""
    sizes = _shard_sizes(cfg, mesh, kind)
    return 4 * sum(jax.tree.leaves(lora.split(sizes)[1] if cfg.lora_rank else sizes))


@functools.lru_cache(maxsize=256)
def _frozen_bytes(cfg: ModelConfig, mesh: MeshShape, kind: str) -> int:
    """Bytes per device of the weights of `cfg.base()` in the compute dtype on the `kind` layout:
    LoRA's frozen weights, and the merged copy the sampler reads."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    return cb * sum(jax.tree.leaves(_shard_sizes(cfg.base(), mesh, kind)))


@functools.lru_cache(maxsize=256)
def _same_layout(cfg: ModelConfig, mesh: MeshShape) -> bool:
    """Whether train and sample layouts agree (then `make_reshard` hands over the arrays themselves)."""
    train, sample = mesh.rules("train"), mesh.rules("sample")
    return all(train.spec(s.axes, s.shape) == sample.spec(s.axes, s.shape)
               for s in jax.tree.leaves(param_specs(cfg), is_leaf=is_spec))


@functools.lru_cache(maxsize=256)
def _optimizer_bytes(cfg: ModelConfig, tc, mesh: MeshShape) -> int:
    """optax state of `make_optimizer` per device: param-like leaves sharded like their parameter,
    the rest (step counts) replicated. Dtypes from jax.eval_shape, so a bf16 moment would count half."""
    from spiral_jax.rl.train_step import make_optimizer

    opt = make_optimizer(tc)
    trained = (lambda tree: lora.split(tree)[1]) if cfg.lora_rank else (lambda tree: tree)
    state = jax.eval_shape(opt.init, trained(abstract_params(cfg)))
    sizes = optax.tree_map_params(opt, lambda leaf, n: n * leaf.dtype.itemsize, state,
                                  trained(_shard_sizes(cfg, mesh, "train")),
                                  transform_non_params=lambda leaf: leaf.size * leaf.dtype.itemsize)
    return int(sum(jax.tree.leaves(sizes)))


def _layer_elements(cfg: ModelConfig, rules: Rules) -> int:
    """Elements of one layer's weights split over tensor only (what an all-gather over fsdp yields)."""
    layers = param_specs(cfg.replace(scan_layers=False))["layers"][0]
    return sum(shard_elements(rules, s.axes, s.shape) for s in layers.values())


def fused(cfg: ModelConfig, hw: Hardware) -> bool:
    """Whether training, scoring and prefill attention run a fused kernel on this hardware (then no
    [rows, heads, T, T] scores exist; `models.fused_attention`)."""
    return resolve_attention(cfg.attention, hw.platform, cfg.compute_dtype, cfg.head_dim) != "xla"


def _train_shapes(cfg: ModelConfig, w: Workload, mesh: MeshShape, fused_attention: bool):
    """Per-device sizes of one micro-batch: rows, slots, and the element counts of the residual
    stream, q/k/v, the MLP's hidden, one layer's attention scores (0 when fused) and a vocab shard."""
    t, dp = mesh.tensor, mesh.batch_shards
    b = w.micro_batch // dp if w.micro_batch % dp == 0 else w.micro_batch
    T, D, hd = w.train_len, cfg.hidden_size, cfg.head_dim
    heads, kv = _split(cfg.num_heads, t), _split(cfg.num_kv_heads, t)
    scores = 0 if fused_attention else b * heads * T * T * 4  # fp32 attention scores of one layer
    return b, T, b * T * D, b * T * (heads + 2 * kv) * hd, b * T * _split(cfg.intermediate_size, t), scores, \
        _split(cfg.vocab_size, t)


def _batch_bytes(w: Workload, mesh: MeshShape) -> int:
    """The packed batch on one device: its share of the rows, each `Workload.row_bytes`."""
    return -(-w.samples // mesh.batch_shards) * w.row_bytes


def _activations(cfg: ModelConfig, w: Workload, mesh: MeshShape, fused_attention: bool = False,
                 platform: str = "cpu") -> int:
    """Activation bytes per device at the peak of one micro-batch's forward + backward pass."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    b, T, act, qkv, mlp, scores, v = _train_shapes(cfg, w, mesh, fused_attention)
    mask = 0 if fused_attention else b * T * T  # the XLA path's boolean [T, T] mask per row
    # Saved for the backward pass: with remat each layer's input; without, every residual of the
    # layer (norm outputs, q/k/v before and after RoPE, fp32 probabilities and their cast, the mask,
    # the MLP's gate/up/activation/product).
    per_layer = act * cb if cfg.remat else (6 * act * cb + 3 * qkv * cb + 2 * scores + mask + 5 * mlp * cb)
    saved = cfg.num_layers * per_layer
    # The backward of one layer, recomputed: the fp32 probabilities stay alive through it, next to
    # their gradients, the MLP's gate/up/activation/product and their gradients, and a few
    # [b, T, D] and q/k/v-sized buffers. (Counts fitted to XLA:CPU's buffer assignment; the TPU
    # compiler keeps two [T, T] buffers where XLA:CPU keeps three.)
    layer = (2 if platform == "tpu" else 3) * scores + 7.5 * mlp * cb + 3 * act * cb + 2 * qkv * cb
    # The loss head, before the layers' backward: fp32 logits of one chunk, softmax, their gradient.
    head = 3.5 * b * w.chunk * v * 4 + 3 * act * cb
    # The packed batch, its micro-batch split and the per-slot outputs.
    batch = 2 * _batch_bytes(w, mesh) + -(-w.samples // mesh.batch_shards) * T * 12
    return int(saved + max(layer, head) + batch)


def _logprob_pass(cfg: ModelConfig, w: Workload, mesh: MeshShape, fused_attention: bool = False) -> int:
    """Bytes per device of PPO's old-log-prob pass beyond the parameters: the batch and the forward of
    one micro-batch, no gradients (one layer's scores and probabilities, q/k/v, the MLP's hidden;
    or one chunk's logits), and the log-probs it returns."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    b, T, act, qkv, mlp, scores, v = _train_shapes(cfg, w, mesh, fused_attention)
    mask = 0 if fused_attention else b * T * T
    layer = 2 * scores + mask + 2 * qkv * cb + 3 * mlp * cb + 2 * act * cb
    head = 3 * b * w.chunk * v * 4 + act * cb
    rows = -(-w.samples // mesh.batch_shards)
    return int(_batch_bytes(w, mesh) + max(layer, head) + 2 * rows * T * 4)


def _weights_in_flight(cfg: ModelConfig, mesh: MeshShape) -> int:
    """Weights gathered over fsdp (and cast to the compute dtype) while the step runs, and their
    gradients before the reduce-scatter: the embedding table, and one layer plus the next."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    gathered, cast = mesh.fsdp > 1, cb != 4
    table = _split(cfg.vocab_size, mesh.tensor) * cfg.hidden_size
    if cfg.lora_rank:  # frozen weights, in the compute dtype already: gathered only, and no gradients
        return int((table + 2 * _layer_elements(cfg.base(), mesh.rules("sample"))) * cb * gathered)
    embed = table * (4 * gathered + cb * (gathered or cast) + 4 * (2 if gathered else 1))
    layer = _layer_elements(cfg, mesh.rules("sample")) * (cb * (gathered or cast) + 4 * gathered)
    return int(embed + 2 * layer)


def _sampling(cfg: ModelConfig, w: Workload, mesh: MeshShape, games: int, new_tokens: int,
              fused_attention: bool = False) -> tuple[int, int]:
    """(KV cache, prefill transients) per device for one generate call over `games` prompts."""
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    dp = mesh.batch_shards
    batch = batch_bucket(games, dp)
    slots = cache_slots(w.prompt_len, new_tokens)
    rules = mesh.rules("sample")
    shape = (cfg.num_layers, batch, slots, cfg.num_kv_heads, cfg.head_dim)
    cache = 2 * shard_elements(rules, CACHE_AXES, shape) * cb
    b, plen, t = batch // dp, w.prompt_len, mesh.tensor
    heads, kv = _split(cfg.num_heads, t), _split(cfg.num_kv_heads, t)
    scores = 0 if fused_attention else b * heads * plen * plen * 4  # the prefill attends over the prompt only
    attention = 2 * scores + 2 * b * plen * (heads + 2 * kv) * cfg.head_dim * cb
    mlp = 3 * b * plen * _split(cfg.intermediate_size, t) * cb
    rest = (2 * b * plen * cfg.hidden_size * cb + cache // cfg.num_layers
            + 2 * b * _split(cfg.vocab_size, t) * 4 + batch * (slots - plen) * 12)
    return int(cache), int(max(attention, mlp) + rest)


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
        per_device = w.micro_batch // dp if w.micro_batch % dp == 0 else w.micro_batch
        width = max(len(x) for x in [*self.labels.values(), *self.phases]) + 2
        lines = [
            f"hardware: {hw.name}: {hw.devices} devices" + (
                f" x {hw.memory / GiB:.1f} GiB ({hw.usable:.0%} usable)" if hw.memory else
                ", memory per device unknown (pass --hardware, or --device_memory_gib)"),
            f"model: {cfg.model_type}, {count} parameters ({cfg.num_layers} layers, "
            f"hidden {cfg.hidden_size}, vocab {cfg.vocab_size}), compute {cfg.compute_dtype}, "
            f"remat {'on' if cfg.remat else 'off'}, scan_layers {'on' if cfg.scan_layers else 'off'}",
            f"mesh: {self.mesh}; micro-batch {w.micro_batch} row(s), {per_device} per device, x {w.train_len}"
            f" slots (response {w.response_len}, logprob chunk {w.chunk})",
            f"sampling: prompt bucket {w.prompt_len}; rollout {w.rollout_games} games per call; eval "
            f"{w.eval_games}, final eval {w.final_games} games, {w.rollout_games or 'all'} at a time",
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


def estimate(cfg: ModelConfig, tc, work: Workload, mesh: MeshShape, hw: Hardware) -> Plan:
    """Per-device bytes of a run with this model, optimizer, workload and mesh on `hw`."""
    params, sample_params = _param_bytes(cfg, mesh, "train"), _param_bytes(cfg, mesh, "sample")
    same_layout, kernel = _same_layout(cfg, mesh), fused(cfg, hw)
    cb = jnp.dtype(cfg.compute_dtype).itemsize
    lora_on, merged = bool(cfg.lora_rank), work.lora_merged
    # With LoRA the sampler, the pool and the frozen opponent read merged weights in the compute dtype,
    # or (lora.sample = "adapters") the frozen weights themselves, with the adapters beside them.
    policy_bytes = _frozen_bytes(cfg, mesh, "sample") if lora_on and merged else sample_params
    parts = {
        "frozen": _frozen_bytes(cfg, mesh, "train") if lora_on else 0,
        "params": params,
        "optimizer": _optimizer_bytes(cfg, tc, mesh),
        "sampler_params": policy_bytes if (lora_on and merged) or not same_layout else 0,
        "snapshots": work.snapshots * policy_bytes,
        "kl_reference": params if tc.kl_coef else 0,
        "gradients": 2 * params,
        "weights_in_flight": _weights_in_flight(cfg, mesh),
        "activations": _activations(cfg, work, mesh, kernel, hw.platform),
        "logprob_pass": _logprob_pass(cfg, work, mesh, kernel) if not tc.on_policy or tc.kl_coef else 0,
        # A forward without gradients (sampling, old log-probs) casts every weight to the compute
        # dtype once, outside its loops: the TPU compiler hoists the casts, holding a whole copy.
        # LoRA's weights and its merged copy are in the compute dtype already.
        "weights_cast": 0 if cb == 4 or lora_on else sample_params * cb // 4,
    }
    labels = {
        "frozen": f"frozen weights beside the LoRA adapters ({cfg.compute_dtype}, train layout)",
        "params": "LoRA adapters (fp32, train layout)" if lora_on else "parameters (fp32, train layout)",
        "optimizer": "optimizer state (AdamW mu + nu, fp32)",
        "sampler_params": ("the merged weights the sampler reads (sample layout)" if lora_on else
                           "sampler's copy of the parameters (sample layout)"),
        "snapshots": f"opponent weights ({work.snapshots}: pool or frozen, sample layout)",
        "kl_reference": "the KL penalty's frozen reference policy (train layout)",
        "gradients": "gradients: one micro-batch's + the fp32 accumulator",
        "weights_in_flight": "weights all-gathered/cast for compute, their grads",
        "activations": f"activations of one micro-batch ({'remat' if cfg.remat else 'no remat'}"
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
    calls = {}  # (games, new-token bucket) -> the phases that make such a sampler call
    for name, games, new in [("rollout", work.rollout_games, work.rollout_new),
                             ("eval", work.in_flight(work.eval_games), work.eval_new),
                             ("final eval", work.in_flight(work.final_games), work.eval_new)]:
        if games > 0:
            calls.setdefault((games, bucket_length(new, 1)), []).append(name)
    for (games, new), names in calls.items():
        name = ", ".join(names)
        cache, prefill = _sampling(cfg, work, mesh, games, new, kernel)
        parts[f"kv {name}"], parts[f"prefill {name}"] = cache, prefill
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
    elif same_layout:
        notes.append("train and sample layouts agree (fsdp 1): the sampler reads the train state, no copy")
    return Plan(hw, mesh, cfg, work, parts, phases, labels, notes)


def plan(c, hw: Hardware, mesh: MeshShape | None = None) -> Plan:
    """The plan of config `c` on `hw` (its own mesh unless `mesh` is given)."""
    from spiral_jax.run.setup import train_config

    cfg, source = model_config(c)
    mesh = mesh or MeshShape.resolve(c.mesh.data, c.mesh.fsdp, c.mesh.tensor, hw.devices)
    work = workload(c)
    result = estimate(cfg, train_config(c.optim), work, mesh, hw)
    notes = [f"model shape from {source}"] + ([f"hardware: {hw.source}"] if hw.source else [])
    if work.micro_batch % mesh.batch_shards or work.samples % work.micro_batch:
        notes.append(f"optim.micro_batch_size={work.micro_batch} must be a multiple of data x fsdp = "
                     f"{mesh.batch_shards} and divide rollout.samples_per_step={work.samples}: the trainer "
                     f"refuses this config")
    chunked = [f"{name} ({n} games)" for name, n in (("eval", work.eval_games), ("final eval", work.final_games))
               if n > work.in_flight(n)]
    if chunked:
        notes.append(f"{' and '.join(chunked)} play at most {work.rollout_games} games at once per host "
                     f"(rollout.games_per_batch): more evaluation games take longer, not more memory")
    if c.bootstrap.enabled and not c.model.path:
        notes.append("not planned: the imitation bootstrap (tiny random models only; its own Adam state)")
    result.notes[:0] = notes
    return result


# ------------------------------------------------------------------------------------ suggestions


def meshes(devices: int):
    """Every (data, fsdp, tensor) whose sizes multiply to `devices`."""
    for data, fsdp in itertools.product(range(1, devices + 1), repeat=2):
        if devices % (data * fsdp) == 0:
            yield MeshShape(data, fsdp, devices // (data * fsdp))


def _largest(candidates, ok) -> int | None:
    """The first (largest) candidate that `ok` accepts."""
    return next((x for x in candidates if ok(x)), None)


def _fewer(n: int) -> list[int]:
    """n, then the powers of two below it: the games per sampler call tried when n do not fit."""
    return [n] + [1 << k for k in range(n.bit_length() - 1, -1, -1) if 1 << k < n]


def suggest(c, hw: Hardware, plan_now: Plan | None = None) -> tuple[str, Plan] | None:
    """The best setup that fits, by the same estimator: (what to change, its plan), or None.

    Searched on every mesh over the same devices (and with remat on): the largest micro-batch that
    divides the step's samples and is a multiple of data x fsdp (as the trainer requires) for the
    train step, and the largest rollout.games_per_batch (up to the configured one) whose sampler
    calls fit: the rollout's, and evaluation's chunks of min(games, games_per_batch) at
    eval.max_new_tokens. The number of evaluation games is never changed: it costs time, not memory.
    The train step and the sampler calls share only the resident state, so each is sized on its own.
    Preferred: the largest micro-batch, then the most games per call (both change only speed), then
    the lowest peak.
    """
    from spiral_jax.run.setup import train_config

    if hw.limit is None:
        return None
    current = plan_now or plan(c, hw)
    cfg, tc, work, limit = current.cfg, train_config(c.optim), current.work, hw.limit
    best, best_key = None, None
    for mesh, remat in itertools.product(meshes(hw.devices), (cfg.remat,) if cfg.remat else (False, True)):
        trial = functools.partial(estimate, cfg.replace(remat=remat), tc, mesh=mesh, hw=hw)
        base = trial(dataclasses.replace(work, rollout_games=0, eval_games=0, final_games=0))
        resident = base.phases["train step"] - sum(base.parts[k] for k in ("gradients", "weights_in_flight",
                                                                           "activations"))

        def sample_fits(games, new, mesh=mesh, resident=resident, base=base):
            return resident + base.parts.get("weights_cast", 0) + sum(
                _sampling(cfg, work, mesh, games, new, fused(cfg, hw))) <= limit

        dp = mesh.batch_shards
        micro = [m for m in range(work.samples, 0, -1) if work.samples % m == 0 and m % dp == 0]

        def calls_fit(g, sample_fits=sample_fits):
            chunk = dataclasses.replace(work, rollout_games=g)
            return (sample_fits(g, work.rollout_new)
                    and all(sample_fits(chunk.in_flight(n), work.eval_new)
                            for n in (work.eval_games, work.final_games) if n > 0))

        sizes = dict(
            micro_batch=_largest(micro, lambda m: trial(dataclasses.replace(
                work, micro_batch=m, rollout_games=0, eval_games=0, final_games=0)).fits),
            rollout_games=_largest(_fewer(work.rollout_games), calls_fit))
        if any(v is None for v in sizes.values()):
            continue
        fit = trial(dataclasses.replace(work, **sizes))
        key = (sizes["micro_batch"], sizes["rollout_games"], -fit.peak)
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
    for field, key in (("micro_batch", "optim.micro_batch_size"), ("rollout_games", "rollout.games_per_batch")):
        if getattr(best.work, field) != getattr(work, field):
            changes.append(f"--config.{key}={getattr(best.work, field)}")
    return " ".join(changes), best


def report(c, hw: Hardware) -> tuple[str, bool | None]:
    """The printed plan (with a warning and a suggestion when it does not fit) and whether it fits."""
    text, mesh_error = [], None
    try:
        p = plan(c, hw)
    except MeshError as e:  # the config's mesh is for other hardware: plan fsdp over all, then suggest
        mesh_error = e
        text.append(f"WARNING: {e}; planned with data=1 fsdp={hw.devices} tensor=1 instead\n")
        p = plan(c, hw, MeshShape(1, hw.devices, 1))
    text.append(p.table())
    if p.fits is False or mesh_error:
        if p.fits is False:
            text.append(f"\nWARNING: this run needs {p.peak / GiB:.2f} GiB per device in its {p.worst_phase}, "
                        f"above the {hw.limit / GiB:.2f} GiB limit of {hw.name}; it would run out of memory.")
        found = suggest(c, hw, p)
        if found is None:
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
                text.append("  (rollout.games_per_batch also bounds evaluation's games per sampler call; "
                            "eval.games and eval.final_games cost time, not memory)")
    return "\n".join(text), False if mesh_error else p.fits
