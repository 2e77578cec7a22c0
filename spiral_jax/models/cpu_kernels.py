"""Small compiled kernels for a decode step on CPU (the C++ sources are in `kernels/`).

A decode step multiplies big weights by a few rows and attends one query per row over the KV cache.
XLA:CPU's library kernels reach about half the machine's FLOP rate on the first once the weight comes
from memory, and spend the second copying the cache (see the .cc files). The kernels are compiled on
first use with the host's C++ compiler for the host's CPU, cached on disk, and registered as XLA FFI
targets. Where they cannot be built (no compiler, no headers) or are turned off with
SPIRAL_JAX_CPU_KERNEL=0, `available()` is False and callers use XLA's own operations: results agree to
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
import numpy as np

log = logging.getLogger(__name__)

_SOURCES = Path(__file__).with_name("kernels")
# FFI target name -> the handler's symbol in the library.
_TARGETS = {"spiral_jax_weight_major_matmul": "SpiralWeightMajorMatmul",
            "spiral_jax_decode_attention": "SpiralDecodeAttention"}
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
    """Compile the kernels (a few seconds) unless these sources, compiler and CPU already have a build."""
    compiler = os.environ.get("CXX", "c++")
    command = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}"]
    sources = sorted(_SOURCES.glob("*.cc"))
    texts = [p.read_text() for p in sorted(_SOURCES.iterdir()) if p.suffix in (".cc", ".h")]
    key = hashlib.sha256("\n".join([*texts, " ".join(command), jax.__version__,
                                    _cpu_identity()]).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SPIRAL_JAX_KERNEL_CACHE", Path.home() / ".cache" / "spiral_jax" / "kernels"))
    library = cache / f"cpu_kernels-{key}.so"
    if not library.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(suffix=".so", dir=cache)
        os.close(fd)
        try:
            subprocess.run([*command, "-o", partial, *map(str, sources)], check=True, capture_output=True, text=True)
            os.replace(partial, library)  # atomic: a concurrent process sees no half-written file
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    return library


@functools.cache
def available() -> bool:
    """Whether the kernels are built and registered (once per process; False, with a warning, if the
    build fails)."""
    if os.environ.get("SPIRAL_JAX_CPU_KERNEL", "1") == "0":
        return False
    try:
        library = ctypes.cdll.LoadLibrary(str(_build()))
    except (OSError, subprocess.CalledProcessError) as e:
        detail = e.stderr[-2000:] if isinstance(e, subprocess.CalledProcessError) else str(e)
        log.warning("spiral_jax: the CPU kernels could not be built, so XLA's slower operations are used "
                    "for decode steps (set CXX to a C++17 compiler, or SPIRAL_JAX_CPU_KERNEL=0 to "
                    "silence this): %s", detail)
        return False
    for target, symbol in _TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu")
    return True


def _require() -> None:
    if not available():
        raise RuntimeError("spiral_jax's CPU kernels are not built on this machine (see the warning above); "
                           "callers check cpu_kernels.available() and use XLA's operations instead")


@jax.custom_vjp
def weight_major_matmul(w: jax.Array, x: jax.Array) -> jax.Array:
    """w [N, K] times x [B, K] -> [N, B], all float32, on CPU (check `available()` first)."""
    _require()
    out = jax.ShapeDtypeStruct((w.shape[0], x.shape[0]), jnp.float32)
    # The kernel reads x transposed, its columns padded to whole 8-float vectors: XLA fuses that copy
    # into whatever computes x, where the kernel would make it on one thread before the others start.
    xt = jnp.pad(x.T, ((0, 0), (0, -x.shape[0] % 8)))
    return jax.ffi.ffi_call("spiral_jax_weight_major_matmul", out, vmap_method="sequential")(w, xt)


def _forward(w, x):
    return weight_major_matmul(w, x), (w, x)


def _backward(saved, grad):
    w, x = saved
    return grad @ x, grad.T @ w


weight_major_matmul.defvjp(_forward, _backward)


def decode_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, layer, allowed: jax.Array, *,
                     scale: float, masked: float) -> jax.Array:
    """One query per row over layer `layer` of the cache: q [B, H, hd] (float32); k_cache, v_cache
    [layers, B, KV, slots, hd]; allowed [B, window] (window <= slots: the slots attended) -> [B, H, hd].

    Scores are q . k * scale, `masked` where not allowed, then a softmax over the window: the model's
    attention, read from the cache in place (check `available()` first; no gradient).
    """
    _require()
    call = jax.ffi.ffi_call("spiral_jax_decode_attention", jax.ShapeDtypeStruct(q.shape, jnp.float32),
                            vmap_method="sequential")
    return call(q, k_cache, v_cache, jnp.asarray(layer, jnp.int32), allowed.astype(bool),
                scale=np.float32(scale), masked=np.float32(masked))
