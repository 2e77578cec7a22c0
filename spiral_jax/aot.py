"""Ahead-of-time compilation of a run's programs for any device topology, and their real memory.

`spiral-jax plan --config C --hardware v5p-8 --compile` builds the programs a training run executes
(the train step at its micro-batch, PPO's old-log-prob pass, the rollout's and evaluation's sampler
programs) over abstract arguments placed on the slice's devices, compiles them with the slice's own
compiler and reads `memory_analysis()`. The devices come from `jax.experimental.topologies`, so
this works on a laptop without the accelerator: for a TPU slice the compiler is libtpu's (the `tpu`
extra); for an NVIDIA preset (1xH200, 8xH100, ...) it is XLA's GPU compiler from JAX's CUDA plugin
(the `cuda` extra), told the card's properties (`hardware.GpuCard`). With no `--hardware` it compiles
for the devices this machine has.

A program's compiled peak covers its arguments, outputs and temporaries. What else stays on the
device while it runs (the optimiser state during sampling, a second copy of the weights in the
sampler's layout, the KL reference, pool snapshots) is added from the planner's exact byte counts,
so each figure is the device's whole footprint in that phase.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax import plan as planner
from spiral_jax.distributed import host_local_mesh
from spiral_jax.models import abstract_params, cpu, lora, param_shardings
from spiral_jax.rl.reshard import sample_config
from spiral_jax.rl.samples import Batch, advantage_slots, batch_shardings, per_row
from spiral_jax.rl.train_step import make_compute_logprobs, make_optimizer, make_train_step, state_shardings
from spiral_jax.sampling import batch_bucket, cache_slots
from spiral_jax.sampling.engine import DecodeEngine
from spiral_jax.sharding import Rules, make_mesh
from spiral_jax.hardware import GiB, Hardware, hardware as preset, parse_accelerator

_HBM = re.compile(r"exceeds available HBM \(([0-9.]+)([KMGT])")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class CompileError(RuntimeError):
    """The slice's compiler could not be reached, or refused a program for a reason other than memory."""


@dataclasses.dataclass(frozen=True)
class Target:
    """The devices to compile for and the memory each one gives a program."""

    name: str
    devices: tuple
    memory: int | None  # usable bytes per device; None = unknown (CPU)


@dataclasses.dataclass(frozen=True)
class Compiled:
    """One program's memory per device, from its compiler, next to the planner's estimate."""

    name: str
    peak: int | None  # memory_analysis().peak_memory_in_bytes; None when it did not fit
    resident: int  # bytes held on the device during the program that are not its arguments
    planned: int  # the planner's peak for this phase
    seconds: float
    error: str = ""  # the compiler's message when the program does not fit

    @property
    def total(self) -> int | None:
        return None if self.peak is None else self.peak + self.resident


def tpu_devices(accelerator: str) -> tuple:
    """Compile-only devices of a Cloud TPU slice (e.g. v5p-8), described by libtpu on any machine."""
    from jax.experimental import topologies

    tpu = parse_accelerator(accelerator)
    topology = tpu.topology()  # a slice without a known chip grid fails here, with its own message
    # Compile-only devices touch no TPU, so several processes may load libtpu at once (tests run in
    # two), and a machine outside Google Cloud has no metadata server to ask about its TPU.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    for name, value in (("TPU_SKIP_MDS_QUERY", "1"), ("TPU_WORKER_HOSTNAMES", "localhost"),
                        ("TPU_ACCELERATOR_TYPE", tpu.accelerator)):
        os.environ.setdefault(name, value)
    try:
        return tuple(topologies.get_topology_desc(**topology).devices)
    except Exception as e:  # libtpu missing, or a version without this topology
        raise CompileError(
            f"cannot describe {tpu.accelerator}'s devices for the TPU compiler ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}); install it with pip install -e '.[tpu]' (libtpu)") from e


def prepare(hardware: str | None) -> None:
    """Get JAX ready to plan or compile for `hardware` (None: devices given by count and memory) rather
    than this machine's devices; call it before anything starts JAX's backends. The persistent
    compilation cache is off: a compile-only target writes executables no process can load back, which
    a program met twice would warn about and compile again. Unless JAX_PLATFORMS says otherwise the
    process runs on the CPU: it never takes the chips of a TPU VM (a training run may hold them), and
    libtpu does not try to start a TPU that is not there. An NVIDIA preset's CUDA plugin loads without
    a GPU."""
    jax.config.update("jax_enable_compilation_cache", False)
    if not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    _skip_cuda_check(hardware)


def _skip_cuda_check(hardware: str | None) -> None:
    """For an NVIDIA preset: JAX's CUDA plugin checks the CUDA driver's version as it loads and, on a
    machine without a GPU (no driver), fails to load, compiler and all, unless told to skip the check."""
    try:
        card = preset(hardware).card if hardware else None
    except ValueError:
        return  # an unknown name fails later, in `target`, with the list of known ones
    if card is not None:
        os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def gpu_devices(hw: Hardware) -> tuple:
    """Compile-only devices of an NVIDIA preset's cards, described to XLA's GPU compiler (JAX's CUDA
    plugin) by their properties: no GPU needs to be attached."""
    from jax.experimental import topologies

    _skip_cuda_check(hw.name)
    try:
        from jax._src.lib import cuda_versions  # the plugin's CUDA and cuDNN, when it is installed
        dnn, runtime = cuda_versions.cudnn_get_version(), cuda_versions.cuda_runtime_get_version()
        versions = dict(cudnn=(dnn // 10000, dnn // 100 % 100), cuda=(runtime // 1000, runtime // 10 % 100))
    except Exception:
        versions = {}
    try:
        return tuple(topologies.get_topology_desc(hw.name, "cuda", target_config=hw.card.target_config(**versions),
                                                  topology=f"1x1x{hw.devices}").devices)
    except Exception as e:  # no CUDA plugin, or one that failed to load
        raise CompileError(
            f"cannot describe {hw.name}'s devices for XLA's GPU compiler ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200]}); install JAX's CUDA plugin with pip install -e '.[cuda]' "
            f"(no GPU is needed to compile). Where it is installed but JAX's log says it failed to load, "
            f"call spiral_jax.aot.prepare({hw.name!r}) before JAX starts, or set "
            f"JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1") from e


def usable_hbm(device) -> int | None:
    """Bytes a program may use on `device`: the runtime's limit, or for compile-only TPU devices the
    'available HBM' the compiler names when it refuses a program far too large to fit."""
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
        if limit:
            return int(limit)
    except Exception:  # compile-only devices have no runtime statistics
        pass
    if device.platform != "tpu":
        return None
    huge = jax.ShapeDtypeStruct((2**40,), jnp.int8, sharding=jax.sharding.SingleDeviceSharding(device))
    try:
        jax.jit(lambda x: x + 1).lower(huge).compile()
    except Exception as e:
        found = _HBM.search(str(e))
        if found:
            return int(float(found.group(1)) * _UNITS[found.group(2)])
    return None


def target(hardware: str | None) -> Target:
    """A TPU slice by accelerator type (v5p-8, ...), an NVIDIA preset (1xH200, 8xH100, ...: the planner's
    usable share of each card), or with None this machine's devices, whose own compiler is the one to ask."""
    if not hardware:
        devices = tuple(jax.devices())
        return Target(f"local {devices[0].platform} x {len(devices)}", devices, usable_hbm(devices[0]))
    hw = preset(hardware)
    if hw.card is not None:
        return Target(hw.name, gpu_devices(hw), int(hw.memory * hw.usable))
    name = parse_accelerator(hardware).accelerator
    devices = tpu_devices(name)
    return Target(name, devices, usable_hbm(devices[0]))


def _placed(abstract, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


def abstract_batch(spec, rows: int, mesh, samples_per_row: int = 1) -> Batch:
    """The packed batch of one update: `rows` of the run's longest row, placed like `shard_batch`, with
    the advantages of as many samples a row as the run packs (`rl.samples.per_row`), so the program is
    the packed one where the attention kernel has a packed layout of its own (cuDNN)."""
    longest = planner.longest_row(spec)
    longest = longest._replace(advantages=np.zeros((1, advantage_slots(samples_per_row)), np.float32))
    return Batch(*(jax.ShapeDtypeStruct((rows, *x.shape[1:]), x.dtype, sharding=s)
                   for x, s in zip(longest, batch_shardings(mesh))))


def _memory(compiled) -> int:
    return int(compiled.memory_analysis().peak_memory_in_bytes)


def _compile(name: str, lower, resident: int, planned: int, log) -> Compiled:
    """Lower and compile one program; a refusal for memory is a result, any other failure an error."""
    log(f"compiling {name} ...")
    start = time.perf_counter()
    try:
        compiled = lower().compile()
    except Exception as e:
        text = str(e)
        if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
            raise CompileError(f"{name} did not compile: {type(e).__name__}: {text[:2000]}") from e
        return Compiled(name, None, resident, planned, time.perf_counter() - start, text.splitlines()[0][:400])
    return Compiled(name, _memory(compiled), resident, planned, time.perf_counter() - start)


@contextlib.contextmanager
def card_capability(hardware: str):
    """While compiling for an NVIDIA preset's card without a GPU, JAX's kernels get the card's compute
    capability when they ask: cuDNN's attention (the packed layout of packed training rows needs a
    Hopper card; it would otherwise ask this machine's GPU, and with none take any card for a
    pre-Hopper one), and Pallas' Triton lowering (which from jax 0.11 refuses to lower with no GPU)."""
    try:
        card = preset(hardware).card
    except ValueError:
        card = None
    if card is None or jax.default_backend() == "gpu":
        yield
        return
    from jax._src.cudnn import fused_attention_stablehlo as cudnn

    def parse(capability: str) -> tuple[int, ...]:
        return tuple(int(x) for x in capability.split("."))

    major, minor = card.compute_capability
    patches = [(cudnn, "check_compute_capability", lambda c: card.compute_capability >= parse(c)),
               (cudnn, "is_cuda_compute_capability_equal", lambda c: card.compute_capability == parse(c))]
    try:
        from jax._src.pallas.triton import gpu_info as triton_gpu
        info = triton_gpu.GpuInfo(gpu_version=None, arch_name=f"{major}.{minor}", compute_capability=10 * major + minor)
        patches.append((triton_gpu, "get_gpu_info", lambda: info))
    except (ImportError, AttributeError, TypeError):  # a JAX whose Triton lowering asks no device, or has none
        pass
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    try:
        for module, name, answer in patches:
            setattr(module, name, answer)
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


@contextlib.contextmanager
def _persistent_cache_off():
    """JAX's persistent compilation cache off for what runs inside, and as it was after. A program
    compiled for devices this process does not have is written to the cache but cannot be loaded from
    it: met again, it warns of an unreadable entry and compiles anew. The cache reads the setting at
    its first compile only, so it is reset on the way in and out (`prepare` turns it off for a whole
    process before any compile)."""
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


@contextlib.contextmanager
def compiling(tgt: Target):
    """Trace programs for `tgt` from this process: its platform's paths (`cpu.compiling_for`) and its
    card's answers to the kernels' questions (`card_capability`); for devices other than this
    machine's, without the persistent compilation cache."""
    here = jax.devices()
    local = all(d in here for d in tgt.devices)
    with (cpu.compiling_for(tgt.devices[0].platform), card_capability(tgt.name),
          contextlib.nullcontext() if local else _persistent_cache_off()):
        yield


def compile_run(spec, tgt: Target, log=print) -> tuple[list[Compiled], planner.Plan]:
    """Compile every program of a run (`RunSpec`) for `tgt`'s devices; (results, the planner's plan).

    The programs are traced as for the target's platform (`cpu.compiling_for`), not this process's
    backend: a TPU or GPU program never takes the CPU layouts.
    """
    with compiling(tgt):
        return _compile_run(spec, tgt, log)


def run_plan(spec, tgt: Target, mesh) -> planner.Plan:
    """The planner's plan of a run on `tgt`'s devices laid out as `mesh`: the sizes its programs take."""
    hw = Hardware(tgt.name, len(tgt.devices), tgt.memory, platform=tgt.devices[0].platform,
                  hosts=len({d.process_index for d in tgt.devices}))
    return planner.plan(spec, hw, planner.MeshShape(mesh.shape["data"], mesh.shape["fsdp"], mesh.shape["tensor"]))


def train_inputs(spec, p: planner.Plan, mesh, platform: str):
    """Abstract arguments of the run's train step on `mesh`, at the plan's sizes: (train state, batch,
    the frozen weights beside LoRA adapters as a tuple of none or one, samples packed a row)."""
    cfg, tc = p.cfg, spec.train
    shardings = state_shardings(cfg, tc, mesh)
    opt = make_optimizer(tc)
    params, frozen = abstract_params(cfg), ()
    if cfg.lora_rank:  # the adapters are trained; the weights beside them are frozen, in the compute dtype
        weights, params = lora.split(params)
        dtype = jnp.dtype(cfg.compute_dtype)
        frozen = (_placed(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), weights),
                          lora.split(param_shardings(cfg, Rules.create(mesh, "train")))[0]),)
    state = _placed(type(shardings)(params, jax.eval_shape(opt.init, params),
                                    jax.ShapeDtypeStruct((), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)),
                    shardings)
    packed = per_row(tc.samples_per_row, cfg, platform)
    return state, abstract_batch(spec, p.work.samples, mesh, packed), frozen, packed


def _compile_run(spec, tgt: Target, log) -> tuple[list[Compiled], planner.Plan]:
    mesh = make_mesh(**spec.mesh, devices=tgt.devices)
    sample_mesh = host_local_mesh(mesh, process=tgt.devices[0].process_index)
    p = run_plan(spec, tgt, mesh)
    cfg, tc, work, parts, phases = p.cfg, spec.train, p.work, p.parts, p.phases
    others = parts.get("kl_reference", 0) + parts.get("snapshots", 0)
    state, batch, frozen, packed = train_inputs(spec, p, mesh, tgt.devices[0].platform)
    results = [_compile(f"train step ({work.micro_batch}-row micro-batches of {work.samples} rows x "
                        f"{work.train_len} slots, up to {packed} sample{'s' * (packed > 1)} a row)",
                        lambda: make_train_step(cfg, tc, mesh).lower(state, batch, *frozen),
                        parts.get("sampler_params", 0) + others, phases["train step"], log)]
    if not tc.on_policy or tc.kl_coef:
        results.append(_compile("old log-probs (PPO's pass before the epochs)",
                                lambda: make_compute_logprobs(cfg, tc, mesh).lower(state.params, batch, *frozen),
                                parts["optimizer"] + parts.get("sampler_params", 0) + others,
                                phases.get("old log-probs", phases["train step"]), log))

    sampler = spec.sampler(sample_config(cfg, spec.lora_merged), sample_mesh)
    sample_params = abstract_params(sampler.cfg)
    if cfg.lora_rank:  # merged weights, or the frozen ones, are in the compute dtype; adapters fp32
        weights, adapters = lora.split(sample_params)
        sample_params = lora.join(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(cfg.compute_dtype)),
                                               weights), adapters)
    if sampler.rules:
        sample_params = _placed(sample_params, sampler.params_sharding)
    # While sampling, the train state stays: its parameters are the sampler's own when the layouts
    # agree (and, with LoRA, when the sampler applies the adapters itself), else a second copy.
    separate = bool(parts.get("sampler_params", 0))
    resident = parts["optimizer"] + others + (parts["params"] + parts.get("frozen", 0) if separate else 0)
    seen = set()
    evaluation = spec.evaluation.sampling
    hosts = len({d.process_index for d in tgt.devices})
    for name, games, _, engines in work.sampler_calls(hosts):
        sp = spec.rollout.sampling if name == "rollout" else evaluation
        prompts = [[0] * spec.rollout.max_prompt_len] * games
        key = (games, cache_slots(work.prompt_len, sp.max_new_tokens), sp.mode, engines) if games else None
        if key is None or key in seen:
            continue
        seen.add(key)
        phase = next(k for k in phases if name in k.split(" (")[0].split(", "))
        if spec.rollout.schedule == "continuous":  # a decode engine per policy, a slot per game in flight
            engine = DecodeEngine(sampler, sp, batch_bucket(games, sampler.min_batch_bucket))
            # The other policies' engines hold their KV caches while this one runs.
            others_kv = parts[f"kv {phase.split(' (')[0]}"] * (engines - 1) // engines
            lowered = functools.cache(functools.partial(engine.lower, sample_params))  # both programs at once
            for program in ("insert", "decode"):
                results.append(_compile(
                    f"{name} engine {program} ({engine.slots} slots x {engine.cache_len}-slot cache, {sp.mode}"
                    + (f", 1 of {engines} engines" if engines > 1 else "") + ")",
                    lambda program=program, lowered=lowered: lowered()[program], resident + others_kv,
                    phases[phase], log))
            continue
        results.append(_compile(f"{name} sampler ({games} games x {sp.max_new_tokens} new tokens, {sp.mode})",
                                lambda prompts=prompts, sp=sp: sampler.lower(sample_params, prompts, sp),
                                resident, phases[phase], log))
    return results, p


def report(results: list[Compiled], p: planner.Plan, tgt: Target) -> tuple[str, bool | None]:
    """The per-program table and the closing line; whether everything fits (None: memory unknown)."""
    width = max(len(r.name) for r in results) + 2
    lines = [f"{'program':<{width}}{'compiled':>10}{'+resident':>11}{'= device':>10}{'planner':>9}"
             f"{'ratio':>7}{'compile s':>11}   (GiB per device)"]
    for r in results:
        if r.total is None:
            lines.append(f"{r.name:<{width}}{'-':>10}{r.resident / GiB:>11.2f}{'OOM':>10}{r.planned / GiB:>9.2f}"
                         f"{'':>7}{r.seconds:>11.0f}   {r.error}")
        else:
            lines.append(f"{r.name:<{width}}{r.peak / GiB:>10.2f}{r.resident / GiB:>11.2f}{r.total / GiB:>10.2f}"
                         f"{r.planned / GiB:>9.2f}{r.planned / r.total:>7.2f}{r.seconds:>11.0f}")
    refused = [r for r in results if r.total is None]
    peak = max((r.total for r in results if r.total is not None), default=0)
    fits = None if tgt.memory is None else not refused and peak <= tgt.memory
    if refused:
        lines.append(f"\n{', '.join(r.name for r in refused)}: the compiler refused it for memory. Lower "
                     f"optim.micro_batch_size or rollout.games_per_batch, or run `spiral-jax plan` without "
                     f"--compile for the planner's suggestion.")
    elif fits is False:
        worst = max(results, key=lambda r: r.total)
        lines.append(f"\n{worst.name} needs {worst.total / GiB:.2f} GiB per device with what stays resident, "
                     f"above the {tgt.memory / GiB:.2f} GiB available.")
    hbm = f"{tgt.memory / GiB:.2f} GiB" if tgt.memory else "unknown memory"
    verdict = {True: "fits", False: "does not fit", None: "memory limit unknown"}[fits]
    lines.append(f"compiled {len(results)} programs for {tgt.name}: peak {peak / GiB:.2f} GiB of {hbm} per "
                 f"device (planner {p.peak / GiB:.2f} GiB): {verdict}")
    return "\n".join(lines), fits
