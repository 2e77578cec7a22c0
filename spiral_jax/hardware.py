"""The hardware table: every fact about the accelerators this project runs on, in one place.

`plan` sizes runs against it, `launch` creates and starts slices by its names, `aot` compiles for its
TPU topologies and `spiral-jax plan --hardware` looks presets up in it. One module, so that a new chip
or a corrected memory figure is one edit, not three that can drift apart. It imports only jax.

Two parts. Cloud TPU slices: what an accelerator type such as v5p-8 or v5litepod-16 means in chips,
hosts, memory and compiler topology (`TpuGeneration`, `GENERATIONS`, `parse_accelerator`). And the
planner's `Hardware` presets: devices and memory per device, the TPU slices by any accelerator type,
8xH100 and the one-GPU boxes 1xH200, 1xH100, 1xL40S, 1x4090 (`HARDWARE`, `hardware`).

Hosts: v4 and v5p accelerator types count TensorCores (2 per chip, 4 chips per host, so v4-8 / v5p-8
are one host and v4-16 / v5p-16 two; https://cloud.google.com/tpu/docs/v5p); v5e and v6e types count
chips: up to 8 chips sit on one VM, bigger slices use 4-chip VMs (v6e-16 = 4 VMs;
https://cloud.google.com/tpu/docs/v6e, https://cloud.google.com/tpu/docs/v5e). Software versions:
https://cloud.google.com/tpu/docs/runtimes ("PyTorch and JAX" table).

Memory per chip is what the TPU compiler (libtpu) reports as available HBM when a program does not
fit, which is a little below the marketed size (v4: 30.75 GiB of 32); `aot.usable_hbm` reads it off
the compiler and tests/test_aot.py checks this table against it.

NVIDIA cards (`GpuCard`, `GPU_CARDS`): what XLA's GPU compiler needs to compile for a card it does
not see (compute capability, SMs, shared memory, L2; NVIDIA's data sheets and CUDA's device
properties), and the data-sheet bandwidth and dense bf16 rate that `bench/rl_step.py` measures against.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax

GB, GiB, MiB = 10**9, 2**30, 2**20
HEADROOM = 0.10  # a plan "fits" below 90% of the usable memory: fragmentation, runtime, estimate error


@dataclass(frozen=True)
class TpuGeneration:
    name: str                 # as people say it: v4, v5e, v5p, v6e
    prefix: str               # the accelerator-type prefix gcloud expects
    runtime: str              # TPU software version (--version of `tpu-vm create`)
    counts_cores: bool        # the number in the type counts TensorCores (2 per chip), not chips
    hbm: int                  # bytes of HBM per chip a program may use (the compiler's figure)
    sizes: tuple[int, ...] = ()  # the valid numbers, when they form a short list
    aliases: tuple[str, ...] = ()

    @property
    def grid_dims(self) -> int:
        """The chip grid's dimensions: 3D tori for v4/v5p, 2D for v5e/v6e."""
        return 3 if self.counts_cores else 2


GENERATIONS = (
    TpuGeneration("v4", "v4", "tpu-ubuntu2204-base", counts_cores=True, hbm=int(30.75 * GiB)),
    TpuGeneration("v5e", "v5litepod", "v2-alpha-tpuv5-lite", counts_cores=False, hbm=int(15.75 * GiB),
                  sizes=(1, 4, 8, 16, 32, 64, 128, 256), aliases=("v5e",)),
    TpuGeneration("v5p", "v5p", "v2-alpha-tpuv5", counts_cores=True, hbm=int(95.74 * GiB)),
    TpuGeneration("v6e", "v6e", "v2-alpha-tpuv6e", counts_cores=False, hbm=int(31.25 * GiB),
                  sizes=(1, 4, 8, 16, 32, 64, 128, 256)),
)


@dataclass(frozen=True)
class TpuSlice:
    accelerator: str          # normalised accelerator type, e.g. v5litepod-16
    generation: TpuGeneration
    chips: int
    hosts: int                # TPU VMs ("workers") in the slice: one JAX process each

    @property
    def runtime(self) -> str:
        return self.generation.runtime

    @property
    def grid(self) -> tuple[int, ...]:
        """The chips' physical layout, e.g. (2, 2, 1) for a v5p-8, (2, 4) for a v5e-8."""
        if self.generation.grid_dims == 2:
            dims = [1, 1]
            while dims[0] * dims[1] < self.chips:  # 2x2, 2x4, 4x4, 4x8, ...
                dims[0 if dims[0] < dims[1] else 1] *= 2
            return tuple(dims)
        small = {1: (1, 1, 1), 2: (2, 1, 1), 4: (2, 2, 1)}
        if self.chips in small:
            return small[self.chips]
        dims = [2, 2, 1]
        while dims[0] * dims[1] * dims[2] < self.chips:  # 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...
            low = min(dims)
            dims[max(i for i, d in enumerate(dims) if d == low)] *= 2
        if dims[0] * dims[1] * dims[2] != self.chips:
            raise ValueError(f"{self.accelerator}: no chip grid known for {self.chips} chips; compile for a "
                             f"slice of a power-of-two number of chips")
        return tuple(dims)

    @property
    def chips_per_host(self) -> tuple[int, int, int]:
        per_host = self.chips // self.hosts
        return {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[per_host]

    def topology(self) -> dict:
        """Arguments of `jax.experimental.topologies.get_topology_desc` for this slice's devices: one
        device per chip (v4 and v5p chips run their two TensorCores as one, 'megacore')."""
        gen = self.generation
        return dict(topology_name=f"{gen.name}:{'x'.join(map(str, self.grid))}", platform="tpu",
                    chip_config_name="megacore" if gen.counts_cores else "default",
                    chips_per_host_bounds=self.chips_per_host, num_slices=1)


def known_accelerators() -> str:
    return ("v4-8, v4-16, v4-32, ... (TensorCores, 8 per host); v5p-8, v5p-16, ... (TensorCores, 8 per "
            "host); v5litepod-1/4/8/16/32/64/128/256 (v5e, chips; v5e-N is accepted too); "
            "v6e-1/4/8/16/32/64/128/256 (chips)")


def parse_accelerator(text: str) -> TpuSlice:
    """The slice of a Cloud TPU accelerator type such as v4-8, v5litepod-16, v5p-8 or v6e-8.

    Raises ValueError (listing the known types) for anything else."""
    base, _, number = text.strip().lower().rpartition("-")
    for gen in GENERATIONS:
        if base in (gen.prefix, *gen.aliases) and number.isdigit():
            n = int(number)
            if gen.counts_cores:
                if n < 8 or n % 8:
                    break
                chips = n // 2
                hosts = chips // 4
            else:
                if n not in gen.sizes:
                    break
                chips = n
                hosts = 1 if n <= 8 else n // 4
            return TpuSlice(f"{gen.prefix}-{n}", gen, chips, hosts)
    raise ValueError(f"unknown TPU accelerator type {text!r}; known: {known_accelerators()}")


@dataclass(frozen=True)
class GpuCard:
    """One NVIDIA card model. `kind`: a substring of the name its driver reports (jax's device_kind)."""

    kind: str
    compute_capability: tuple[int, int]
    sms: int
    memory: int  # bytes
    bandwidth: float  # bytes/s, data sheet
    bf16_flops: float  # dense FLOP/s, data sheet
    l2_cache: int  # bytes
    clock_ghz: float  # boost clock
    shared_memory_per_sm: int  # bytes
    threads_per_sm: int
    fp32_lanes_per_sm: int = 128

    def target_config(self, cudnn: tuple[int, int] = (9, 8), cuda: tuple[int, int] = (12, 8)) -> str:
        """The card as XLA's `GpuTargetConfigProto` (text format): what its GPU compiler compiles for when
        no GPU is attached. One KiB of each SM's shared memory is the driver's, so a block may opt in to
        the rest. The driver is taken to be as new as the CUDA runtime, which a machine running that
        runtime has: XLA keeps library calls and on-device control flow out of its CUDA graphs where it
        knows of no driver that can run them, so without one the program would not be the GPU's."""
        (major, minor), (dnn_major, dnn_minor), (rt_major, rt_minor) = self.compute_capability, cudnn, cuda
        return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {self.shared_memory_per_sm}
  shared_memory_per_block_optin: {self.shared_memory_per_sm - 1024}
  threads_per_core_limit: {self.threads_per_sm}
  core_count: {self.sms}
  fpus_per_core: {self.fp32_lanes_per_sm}
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {int(self.bandwidth)}
  l2_cache_size: {self.l2_cache}
  clock_rate_ghz: {self.clock_ghz}
  device_memory_size: {self.memory}
  cuda_compute_capability {{ major: {major} minor: {minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
  driver_version: "{rt_major}.{rt_minor}.0"
}}
platform_name: "CUDA"
dnn_version_info {{ major: {dnn_major} minor: {dnn_minor} }}
runtime_version {{ major: {rt_major} minor: {rt_minor} }}
device_description_str: "NVIDIA {self.kind}"
"""


_HOPPER = dict(compute_capability=(9, 0), sms=132, l2_cache=50 * MiB, clock_ghz=1.98, shared_memory_per_sm=228 * 1024,
               threads_per_sm=2048, bf16_flops=989e12)
_ADA = dict(compute_capability=(8, 9), shared_memory_per_sm=100 * 1024, threads_per_sm=1536)
GPU_CARDS = {card.kind: card for card in (
    GpuCard("H200", memory=141 * GB, bandwidth=4.8e12, **_HOPPER),
    GpuCard("H100", memory=80 * GB, bandwidth=3.35e12, **_HOPPER),
    GpuCard("A100", (8, 0), sms=108, memory=80 * GB, bandwidth=2.0e12, bf16_flops=312e12, l2_cache=40 * MiB,
            clock_ghz=1.41, shared_memory_per_sm=164 * 1024, threads_per_sm=2048, fp32_lanes_per_sm=64),
    GpuCard("L40S", sms=142, memory=48 * GB, bandwidth=0.864e12, bf16_flops=362e12, l2_cache=96 * MiB,
            clock_ghz=2.52, **_ADA),
    GpuCard("A6000", (8, 6), sms=84, memory=48 * GB, bandwidth=0.768e12, bf16_flops=155e12, l2_cache=6 * MiB,
            clock_ghz=1.80, shared_memory_per_sm=100 * 1024, threads_per_sm=1536),
    GpuCard("4090", sms=128, memory=24 * GB, bandwidth=1.008e12, bf16_flops=165e12, l2_cache=72 * MiB,
            clock_ghz=2.52, **_ADA),
)}


# Boards whose data sheet differs from their family's entry above (the PCIe and NVL boards, the 40 GB
# A100, Grace Hopper): they have none, so a bench measures their rates instead of reading another
# board's bandwidth and peak.
_OTHER_BOARDS = ("PCIE", "NVL", "40GB", "GH200")


def gpu_card(device_kind: str) -> GpuCard | None:
    """The card whose kind is in a device's name ("NVIDIA H200" -> H200), else None (also for the
    boards of a family whose data sheet is another: "NVIDIA H100 PCIe")."""
    name = device_kind.upper()
    if any(board in name for board in _OTHER_BOARDS):
        return None
    return next((c for k, c in GPU_CARDS.items() if k.upper() in name), None)


@dataclass(frozen=True)
class Hardware:
    """Devices and memory per device. `usable`: the share of it a JAX process gets by default."""

    name: str
    devices: int
    memory: int | None  # bytes per device; None = unknown (CPU)
    usable: float = 1.0
    source: str = ""
    platform: str = "cpu"  # tpu, gpu or cpu: decides the attention kernel model.attention="auto" picks
    card: GpuCard | None = None  # NVIDIA presets: the card, which `aot` compiles for without one
    hosts: int = 1  # machines (JAX processes) the devices are spread over, the same number on each

    @property
    def devices_per_host(self) -> int:
        """Devices of one host: each host samples on its own (`distributed.host_local_mesh`)."""
        return self.devices // self.hosts

    @property
    def limit(self) -> int | None:
        """Bytes per device a plan may use and still count as fitting (usable memory less headroom)."""
        return None if self.memory is None else int(self.memory * self.usable * (1 - HEADROOM))


def tpu_hardware(accelerator: str) -> Hardware:
    """A Cloud TPU slice by accelerator type (v4-8, v5p-16, v5litepod-8, ...): one device per chip, with
    the HBM per chip that the TPU compiler makes available (`GENERATIONS`)."""
    tpu = parse_accelerator(accelerator)
    return Hardware(f"{tpu.generation.name}-{tpu.accelerator.rpartition('-')[2]}", tpu.chips, tpu.generation.hbm,
                    source=f"Cloud TPU {tpu.accelerator}: {tpu.chips} chips on {tpu.hosts} host(s), "
                           f"{tpu.generation.hbm / GiB:.2f} GiB of HBM per chip available to a program (libtpu)",
                    platform="tpu", hosts=tpu.hosts)


HARDWARE = {h.name: h for h in (
    *(tpu_hardware(name) for name in ("v4-8", "v5e-8", "v5p-8", "v6e-8")),
    Hardware("8xH100", 8, 80 * GB, usable=0.75,
             source="8x NVIDIA H100 80 GB; planned at 75%, JAX's default GPU preallocation "
                    "(XLA_PYTHON_CLIENT_MEM_FRACTION raises it)", platform="gpu", card=GPU_CARDS["H100"]),
    *(Hardware(f"1x{name}", 1, GPU_CARDS[name].memory, usable=0.75,
               source=f"one {cards} with {GPU_CARDS[name].memory // GB} GB; planned at 75%, JAX's default GPU "
                      f"preallocation (XLA_PYTHON_CLIENT_MEM_FRACTION raises it)", platform="gpu",
               card=GPU_CARDS[name])
      for name, cards in (("H200", "NVIDIA H200"), ("H100", "NVIDIA H100 or A100"),
                          ("L40S", "NVIDIA L40S or RTX A6000"), ("4090", "NVIDIA RTX 4090"))),
)}
ALIASES = {"h100x8": "8xH100", "8xh100": "8xH100", "h100-8": "8xH100", "h200": "1xH200", "h100": "1xH100",
           "a100": "1xH100", "1xa100": "1xH100", "l40s": "1xL40S", "a6000": "1xL40S", "1xa6000": "1xL40S",
           "4090": "1x4090", "rtx4090": "1x4090"}


def hardware(name: str) -> Hardware:
    """A preset by name (case-insensitive, surrounding whitespace ignored, a few aliases), or any Cloud
    TPU accelerator type."""
    name = name.strip()
    key = {k.lower(): k for k in HARDWARE}.get(name.lower()) or ALIASES.get(name.lower())
    if key is not None:
        return HARDWARE[key]
    try:
        return tpu_hardware(name)
    except ValueError:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}, any Cloud TPU type "
                         f"(v5p-16, v5litepod-32, ...) (or pass --devices N --device_memory_gib G)") from None


def custom_hardware(devices: int, memory_gib: float | None, hosts: int = 1) -> Hardware:
    """Any other slice or box: a device count and, if known, GiB per device (0/None: no limit), on
    `hosts` machines with the same number each."""
    if devices < 1:
        raise ValueError(f"--devices must be >= 1, got {devices}")
    if hosts < 1 or devices % hosts:
        raise ValueError(f"--hosts {hosts}: give the machines the {devices} devices are spread over, the same "
                         f"number on each (a divisor of --devices)")
    if memory_gib is not None and memory_gib < 0:
        raise ValueError(f"--device_memory_gib must be > 0 (GiB per device), got {memory_gib:g}; leave it out "
                         f"when the memory is unknown")
    memory = None if not memory_gib else int(memory_gib * GiB)
    name = f"{devices} x {memory_gib:g} GiB" if memory else f"{devices} devices"
    return Hardware(name + (f" on {hosts} hosts" if hosts > 1 else ""), devices, memory, hosts=hosts)


def planned_hardware(name: str = "", devices: int | None = None, memory_gib: float | None = None,
                     hosts: int | None = None) -> Hardware:
    """What `spiral-jax plan` plans for: the hardware `name`; else `devices` devices of `memory_gib`
    GiB each (unknown without it) on `hosts` machines (1 without it); else the devices JAX sees here,
    with `memory_gib` where given. None: the flag was not given. A combination that would ignore a
    flag is refused."""
    if name and devices is not None:
        raise ValueError("pass --hardware or --devices, not both")
    if hosts is not None and devices is None:
        raise ValueError("--hosts is for --devices; a --hardware preset and this machine's devices know their "
                         "hosts: leave it out")
    if name and memory_gib is not None:
        raise ValueError("--device_memory_gib is for --devices or this machine's devices; a --hardware preset has "
                         "its own memory per device: leave out one of them")
    if memory_gib is not None and not 0 < memory_gib < float("inf"):  # nan and inf too
        raise ValueError(f"--device_memory_gib must be > 0 (GiB per device), got {memory_gib:g}; leave it out "
                         f"when the memory is unknown")
    if name:
        return hardware(name)
    if devices is not None:
        return custom_hardware(devices, memory_gib, 1 if hosts is None else hosts)
    here = local_hardware()
    return here if memory_gib is None else custom_hardware(here.devices, memory_gib)


def local_hardware() -> Hardware:
    """The devices JAX sees here; memory from the runtime where it reports it (TPU, GPU), else unknown."""
    devices = jax.devices()
    stats = devices[0].memory_stats() if hasattr(devices[0], "memory_stats") else None
    memory = (stats or {}).get("bytes_limit")
    return Hardware(f"local {devices[0].platform} x {len(devices)}", len(devices), memory,
                    platform=devices[0].platform, hosts=len({d.process_index for d in devices}))
