"""A decode step's attention on a GPU: XLA's against the Pallas kernel (model.decode_attention=pallas), side by side.

Each measures one query a row over the stacked cache of a real model's heads (`--layers` of them,
each layer's attention timed in one program, as the unrolled decoder runs them) at 1, 16 and 32 rows,
with every row at the window's end ("full": a sampler call's rows, which share their slot) and with
rows spread over the window ("spread": a decode engine's, each at its own length; row i at slot
prompt + i/rows of the new tokens). Each time is set against two floors at the bandwidth of a plain
reduction over 256 MiB: the filled cache (what the kernel reads) and the whole window (what XLA's
masked attention reads). It checks the two outputs agree (bf16 rounding) and exits 1 if not.

    python bench/decode_attention.py                    # Qwen3-4B's heads, 2048 + 4096 slots
    python bench/decode_attention.py --shape 0.6b --rows 1 64
    python bench/decode_attention.py --shape tiny --interpret   # on CPU: the kernel in Pallas' interpreter
"""
from __future__ import annotations

import argparse
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from device import measured_bandwidth, seconds
from spiral_jax.models import decode_attention_gpu as gpu, transformer
from spiral_jax.models.shapes import QWEN3

HEADS = {name: (s["num_heads"], s["num_kv_heads"], s["head_dim"]) for name, s in QWEN3.items()}
HEADS["tiny"] = (4, 2, 16)


def query_slots(fill: str, rows: int, prompt: int, window: int) -> np.ndarray:
    if fill == "full":
        return np.full(rows, window - 1)
    return prompt + (np.arange(rows) + 1) * (window - prompt) // (rows + 1)


def layer_programs(layers: int, interpret: bool, split_slots: list[int]):
    """XLA's and the kernel's (one per `split_slots`) jitted attention of every layer, one after
    another: [layers, B, 1, H, hd] each, by name."""
    def xla(q, k, v, kv_mask, q_slots):
        w = kv_mask.shape[1]
        return jnp.stack([transformer.attention(q, k[i, :, :, :w], v[i, :, :, :w], q_slots[:, None], kv_mask)
                          for i in range(layers)])

    def pallas(q, k, v, kv_mask, q_slots, most):
        allowed = transformer._allowed(kv_mask, q_slots[:, None])[:, 0]
        return jnp.stack([gpu.decode_attention(q, k, v, i, allowed, q_slots, transformer.MASKED, interpret=interpret,
                                               split_slots=most) for i in range(layers)])

    return {"xla": jax.jit(xla), **{f"pallas {most}": jax.jit(functools.partial(pallas, most=most))
                                    for most in split_slots}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=list(HEADS), default="4b", help="whose attention heads")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--prompt", type=int, default=2048, help="slots before the first new token")
    parser.add_argument("--window", type=int, default=6144, help="the attention window: prompt + new tokens")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--split_slots", type=int, nargs="+", default=[gpu._SPLIT_SLOTS, 512, 4096],
                        help="the kernel with at most this many slots a program (the first is the one compared "
                        "on the last line; the kernel's default first)")
    parser.add_argument("--interpret", action="store_true", help="the kernel in Pallas' interpreter (CPU)")
    args = parser.parse_args()

    heads, kv, hd = HEADS[args.shape]
    dtype = jnp.dtype(args.dtype)
    token_bytes = 2 * kv * hd * dtype.itemsize  # keys and values of one slot of one layer
    rate = measured_bandwidth()
    programs = layer_programs(args.layers, args.interpret, args.split_slots)
    first = f"pallas {args.split_slots[0]}"
    print(f"{args.shape} heads ({heads} query, {kv} KV, {hd} wide), {args.dtype} cache, window {args.window} "
          f"(prompt {args.prompt}), {args.layers} layers a program, on {jax.devices()[0].device_kind}; "
          f"floors at {rate / 1e9:.0f} GB/s (a reduction's rate here); pallas N: the kernel, at most N slots a "
          f"program")
    rng = np.random.default_rng(0)
    worst, ratios = 0.0, {}
    for rows in args.rows:
        k, v = (jnp.asarray(rng.standard_normal((args.layers, rows, kv, args.window, hd), np.float32), dtype)
                for _ in range(2))
        q = jnp.asarray(rng.standard_normal((rows, 1, heads, hd), np.float32), dtype)
        kv_mask = jnp.ones((rows, args.window), bool)
        for fill in ("full", "spread"):
            q_slots = jnp.asarray(query_slots(fill, rows, args.prompt, args.window), jnp.int32)
            filled = float(np.sum(np.asarray(q_slots) + 1)) * token_bytes / rate
            whole = rows * args.window * token_bytes / rate
            times, outs = {}, {}
            for name, fn in programs.items():
                run = functools.partial(fn, q, k, v, kv_mask, q_slots)
                outs[name] = np.asarray(run(), np.float32)  # compiles
                times[name] = min(seconds(lambda: run().block_until_ready()) for _ in range(args.repeats))
                times[name] /= args.layers
                worst = max(worst, float(np.abs(outs[name] - outs["xla"]).max()))
            ratios[rows, fill] = times[first] / times["xla"]
            kernels = ", ".join(f"{name} {t * 1e6:.1f} us ({t / filled:.2f}x)" for name, t in times.items()
                                if name != "xla")
            print(f"{rows:3d} rows, {fill:6s}: xla {times['xla'] * 1e6:.1f} us ({times['xla'] / whole:.2f}x the "
                  f"window's floor {whole * 1e6:.1f} us); against the filled cache's floor {filled * 1e6:.1f} us: "
                  f"{kernels}; pallas/xla {ratios[rows, fill]:.2f}")
    bound = 2e-6 if dtype == jnp.float32 else 3e-2
    print(f"largest |pallas - xla| {worst:.2g} (bound {bound:g}): {'OK' if worst <= bound else 'MISMATCH'}")
    print(f"{first}/xla " + ", ".join(f"{rows} {fill} {r:.2f}" for (rows, fill), r in ratios.items()))
    return 0 if worst <= bound else 1


if __name__ == "__main__":
    sys.exit(main())
