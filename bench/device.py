"""The device a bench runs on: its memory bandwidth and peak FLOP/s (flags, the data-sheet table or
measured), and on a GPU the kernels a program ran (a jax.profiler trace) and where their time went."""
import math
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from spiral_jax import hardware


def measured_bandwidth() -> float:
    """Bytes/s of a reduction over 256 MiB (best of 5)."""
    x = jnp.ones(2**26, jnp.float32)
    total = jax.jit(jnp.sum)
    total(x).block_until_ready()
    return x.nbytes / min(seconds(lambda: total(x).block_until_ready()) for _ in range(5))


def measured_flops(dtype) -> float:
    """FLOP/s of a 2048-wide matmul in the compute dtype (best of 5)."""
    a = jnp.ones((2048, 2048), dtype)
    mm = jax.jit(jnp.matmul)
    mm(a, a).block_until_ready()
    return 2 * 2048**3 / min(seconds(lambda: mm(a, a).block_until_ready()) for _ in range(5))


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def device_rates(args, dtype) -> tuple[float, float, str]:
    """(bytes/s, FLOP/s, where they came from): the flags, else the data-sheet table, else measured
    (always on CPU, whose data sheet depends on the machine)."""
    kind = jax.devices()[0].device_kind
    card = None if jax.default_backend() == "cpu" else hardware.gpu_card(kind)
    sheet = None if card is None else (card.bandwidth / 1e12, card.bf16_flops / 1e12)
    if args.bandwidth_tbs and args.peak_tflops:
        sheet, source = (args.bandwidth_tbs, args.peak_tflops), "flags"
    elif sheet is None:
        sheet, source = (measured_bandwidth() / 1e12, measured_flops(dtype) / 1e12), "measured here"
    else:
        source = f"{kind} data sheet"
    if bool(args.bandwidth_tbs) != bool(args.peak_tflops):
        source += ", and a flag"
    bandwidth, flops = args.bandwidth_tbs or sheet[0], args.peak_tflops or sheet[1]
    return bandwidth * 1e12, flops * 1e12, source


def gpu_kernels(fn) -> tuple[list[tuple[str, float, float]], str]:
    """The GPU kernels `fn()` ran, as (name, start ns, duration ns) from a device trace (jax.profiler),
    and, where there are none (a CPU, or a trace without the GPU's streams), a note saying why."""
    try:
        from jax.profiler import ProfileData
        with tempfile.TemporaryDirectory() as trace:
            with jax.profiler.trace(trace):
                fn()
            data = ProfileData.from_file(str(next(Path(trace).rglob("*.xplane.pb"))))
    except Exception as e:  # noqa: BLE001 - the trace only adds detail; the bench's figures stand without it
        return [], f"no device trace ({type(e).__name__}: {e})"
    lines = [line for plane in data.planes if plane.name.startswith("/device:GPU") for line in plane.lines]
    kernels = [(e.name, e.start_ns, e.duration_ns) for line in lines if line.name.startswith("Stream")
               for e in line.events]
    return kernels, "" if kernels else f"no GPU kernels in the trace (its GPU lines: {[x.name for x in lines]})"


def busy_time(intervals) -> float:
    """The time in which at least one of the (name, start, duration) intervals ran (kernels, program
    making), in their unit: the union of the intervals."""
    total, end = 0.0, -math.inf
    for _, start, duration in sorted(intervals, key=lambda k: k[1]):
        if start + duration > end:
            total += start + duration - max(start, end)
            end = start + duration
    return total


def kernel_seconds(kernels, key=lambda name: name) -> dict[str, float]:
    """Seconds of the (name, start ns, duration ns) kernels summed by key(name), the most first."""
    seconds = {}
    for name, _, ns in kernels:
        seconds[key(name)] = seconds.get(key(name), 0.0) + ns / 1e9
    return dict(sorted(seconds.items(), key=lambda kv: -kv[1]))


def print_kernels(run, steps: int, step_s: float) -> None:
    """Where a decode step's time goes on a GPU: kernels a step, the time they keep the GPU busy
    against the step's time (the rest is launch gaps and host work), and the kernels taking the most.
    run(n): the program decoding n tokens; the difference of n = steps and n = 1 is steps - 1 steps."""
    (one, note), (many, _) = gpu_kernels(lambda: run(1)), gpu_kernels(lambda: run(steps))
    if not many:
        print(f"  kernels of a decode step: {note}")
        return
    count = (len(many) - len(one)) / (steps - 1)
    busy = (busy_time(many) - busy_time(one)) / (steps - 1) / 1e9
    top = list(kernel_seconds(many).items())[:6]
    print(f"  on the GPU: {count:.0f} kernels a step, busy {busy * 1e3:.2f} ms of the {step_s * 1e3:.2f} ms step "
          f"({busy / step_s:.0%}); the most time a step: "
          + ", ".join(f"{n[:48]} {t / (steps - 1) * 1e6:.0f} us" for n, t in top))


# The kinds of GPU kernel a training pass runs, by what their names contain (XLA's Triton products
# are gemm_fusion_*, cuBLAS's xmma/nvjet/cutlass kernels; cuDNN's fused attention sdpa/fmha/flash).
KERNEL_KINDS = (("matmul", ("gemm", "xmma", "nvjet", "cutlass", "matmul")),
                ("attention", ("sdpa", "fmha", "flash", "attention")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, marks in KERNEL_KINDS if any(m in low for m in marks)), "other")


def print_pass_kernels(label: str, run, seconds: float, product_flops: float) -> None:
    """Where a training pass's time goes on a GPU: its kernels' busy time against the pass's time
    (`seconds`, timed without the trace), the busy time by kind of kernel, the rate of the matmul
    kernels at the weights' product FLOPs, and the kernels taking the most."""
    kernels, note = gpu_kernels(run)
    if not kernels:
        print(f"  kernels of {label}: {note}")
        return
    kinds, top = kernel_seconds(kernels, kernel_kind), list(kernel_seconds(kernels).items())[:4]
    busy = busy_time(kernels) / 1e9
    rate = f"; the matmuls at {product_flops / kinds['matmul'] / 1e12:.0f} TFLOP/s" if kinds.get("matmul") else ""
    print(f"  on the GPU, {label}: {len(kernels):,} kernels busy {busy:.2f} s of {seconds:.2f} s ({busy / seconds:.0%}); "
          + ", ".join(f"{kind} {t:.2f} s" for kind, t in kinds.items()) + rate
          + "; the most time: " + ", ".join(f"{n[:40]} {t:.2f} s" for n, t in top))
