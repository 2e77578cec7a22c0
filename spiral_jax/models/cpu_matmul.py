"""A big weight times a few rows on CPU, through a small compiled kernel (`cpu_matmul.cc`).

Every product of a decode step has that shape, and XLA:CPU's library kernels reach only about half
the machine's FLOP rate on it once the weight comes from memory (see the .cc file). The kernel is
compiled on first use with the host's C++ compiler for the host's CPU, cached on disk, and registered
as an XLA FFI target. Where it cannot be built (no compiler, no headers) or is turned off with
SPIRAL_JAX_CPU_KERNEL=0, `available()` is False and callers use XLA's own dot: results agree to
float rounding either way.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("cpu_matmul.cc")
_TARGET = "spiral_jax_weight_major_matmul"
_FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-w"]


def _cpu_identity() -> str:
    """What -march=native depends on, so a cache shared between hosts (an NFS home) keeps one build
    per kind of CPU."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(
            ("flags", "Features")))
    except (OSError, StopIteration):
        flags = platform.processor()
    return f"{platform.machine()} {flags}"


def _build() -> Path:
    """Compile the kernel (about 2 s) unless this source, compiler and CPU already have a build."""
    compiler = os.environ.get("CXX", "c++")
    command = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}"]
    key = hashlib.sha256("\n".join([_SOURCE.read_text(), " ".join(command), jax.__version__,
                                    _cpu_identity()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SPIRAL_JAX_KERNEL_CACHE", Path.home() / ".cache" / "spiral_jax" / "kernels"))
    library = cache / f"cpu_matmul-{key}.so"
    if not library.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        try:
            subprocess.run([*command, "-o", partial, str(_SOURCE)], check=True, capture_output=True, text=True)
            os.replace(partial, library)  # atomic: a concurrent process sees no half-written file
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return library


@functools.cache
def available() -> bool:
    """Whether the kernel is built and registered (once per process; False, with a warning, if the
    build fails)."""
    if os.environ.get("SPIRAL_JAX_CPU_KERNEL", "1") == "0":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(_build()))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr[-2000:] if isinstance(e, subprocess.CalledProcessError) else str(e)
        log.warning("spiral_jax: the CPU matmul kernel could not be built, so XLA's slower dot is used "
                    "for decode-step products (set CXX to a C++17 compiler, or SPIRAL_JAX_CPU_KERNEL=0 to "
                    "silence this): %s", detail)
        return False
    jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(library.SpiralWeightMajorMatmul), platform="cpu")
    return True


@jax.custom_vjp
def weight_major_matmul(w: jax.Array, x: jax.Array) -> jax.Array:
    """w [N, K] times x [B, K] -> [N, B], all float32, on CPU (check `available()` first)."""
    out = jax.ShapeDtypeStruct((w.shape[0], x.shape[0]), jnp.float32)
    # The kernel reads x transposed, its columns padded to whole 8-float vectors: XLA fuses that copy
    # into whatever computes x, where the kernel would make it on one thread before the others start.
    xt = jnp.pad(x.T, ((0, 0), (0, -x.shape[0] % 8)))
    return jax.ffi.ffi_call(_TARGET, out, vmap_method="sequential")(w, xt)


def _forward(w, x):
    return weight_major_matmul(w, x), (w, x)


def _backward(saved, grad):
    w, x = saved
    return grad @ x, grad.T @ w


weight_major_matmul.defvjp(_forward, _backward)
