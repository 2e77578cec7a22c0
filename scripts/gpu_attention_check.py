"""Check cuDNN fused attention on an NVIDIA GPU against the decoder's XLA attention.

    python scripts/gpu_attention_check.py            # about a minute on one H200

1. Parity: `fused_attention.cudnn_attention` (cuDNN flash attention through jax.nn.dot_product_attention)
   against `transformer.attention` in bf16, outputs and input gradients, on left-padded (prompt),
   right-padded (training row) and full rows, at Qwen3's head layout (32 query heads over 8 key/value
   heads, 128 wide). Tolerances are bf16's: both paths round the same fp32 softmax differently.
2. Packed rows (`rl.samples`, optim.samples_per_row > 1): cuDNN's packed layout (`segments` > 1)
   against the XLA path's segment mask, outputs and gradients, on rows of one to four segments; it
   says whether this JAX takes k and v as they are or repeated to one head per query head.
3. The decoder: the logits of a 4-layer Qwen3-shaped model with attention="cudnn" against "xla".
4. Memory and time of one layer's attention forward + backward at the paper's row of 6144 slots:
   the compiled temporaries of both paths, and their step times.

Its verdicts come before the timings: `packed attention: OK` (or MISMATCH) and `cudnn attention:
OK` for all three checks. Exit status 1 if a parity check fails. Needs JAX with CUDA (pip install -e '.[cuda]').
"""
from __future__ import annotations

import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.models import fused_attention, transformer
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import init_params

GiB = 1 << 30


def qkv(b, t, h=32, kv=8, hd=128, seed=0):
    r = np.random.default_rng(seed)
    q, k, v = (jnp.asarray(r.standard_normal((b, t, n, hd)), jnp.bfloat16) for n in (h, kv, kv))
    mask = np.zeros((b, t), bool)
    mask[0, : t * 3 // 4] = True  # right-padded: a training row
    mask[1, t // 3:] = True  # left-padded: a prompt
    mask[2:, :] = True
    return q, k, v, jnp.asarray(mask)


def xla_attention(q, k, v, mask):
    """The decoder's XLA path on the fused kernels' layout (k, v [B,T,KV,hd]; the path takes heads first)."""
    return transformer.attention(q, k.swapaxes(1, 2), v.swapaxes(1, 2), jnp.arange(q.shape[1]), mask)


def parity(b=4, t=1000) -> bool:
    q, k, v, mask = qkv(b, t)
    real = np.asarray(mask)[..., None, None]
    loss = lambda fn: lambda *a: jnp.sum(jnp.where(real, fn(*a, mask).astype(jnp.float32), 0) ** 2)  # noqa: E731
    ok = True
    out_f, out_x = (np.asarray(jax.jit(fn)(q, k, v, mask), np.float32)
                    for fn in (fused_attention.cudnn_attention, xla_attention))
    err = np.abs(np.where(real, out_f - out_x, 0)).max()
    print(f"attention output, bf16, {b}x{t}: max |cudnn - xla| = {err:.4f} (bound 0.03)")
    ok &= bool(err < 0.03) and bool(np.isfinite(out_f).all())
    grads = [jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2)))(q, k, v)
             for fn in (fused_attention.cudnn_attention, xla_attention)]
    for name, gf, gx in zip("qkv", *grads):
        gf, gx = np.asarray(gf, np.float32), np.asarray(gx, np.float32)
        rel = np.abs(gf - gx).max() / np.abs(gx).max()
        print(f"gradient d{name}: max |cudnn - xla| / max |xla| = {rel:.4f} (bound 0.02)")
        ok &= bool(rel < 0.02)
    return ok


def packed_parity(b=4, t=1024, segments=4) -> bool:
    q, k, v, _ = qkv(b, t)
    ids = np.zeros((b, t), np.int32)
    ids[0, :300], ids[0, 300:700], ids[0, 700:1000] = 1, 2, 3  # three samples, then padding
    ids[1, :] = 1
    ids[2, :100], ids[2, 100:101], ids[2, 101:900], ids[2, 900:] = 1, 2, 3, 4
    ids[3, :512] = 1
    ids = jnp.asarray(ids)
    real = np.asarray(ids > 0)[..., None, None]
    cudnn = lambda q, k, v: fused_attention.cudnn_attention(q, k, v, ids, segments=segments)  # noqa: E731
    xla = lambda q, k, v: xla_attention(q, k, v, ids)  # noqa: E731
    out_f, out_x = (np.asarray(jax.jit(fn)(q, k, v), np.float32) for fn in (cudnn, xla))
    err = np.abs(np.where(real, out_f - out_x, 0)).max()
    print(f"packed attention output, bf16, {b}x{t}, up to {segments} segments a row: max |cudnn - xla| = "
          f"{err:.4f} (bound 0.03)")
    ok = bool(err < 0.03) and bool(np.isfinite(out_f).all())
    loss = lambda fn: lambda *a: jnp.sum(jnp.where(real, fn(*a).astype(jnp.float32), 0) ** 2)  # noqa: E731
    grads = [jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2)))(q, k, v) for fn in (cudnn, xla)]
    for name, gf, gx in zip("qkv", *grads):
        gf, gx = np.asarray(gf, np.float32), np.asarray(gx, np.float32)
        rel = np.abs(gf - gx).max() / np.abs(gx).max()
        print(f"packed gradient d{name}: max |cudnn - xla| / max |xla| = {rel:.4f} (bound 0.02)")
        ok &= bool(rel < 0.02) and bool(np.isfinite(gf).all())
    return ok


def decoder_parity() -> bool:
    cfg = ModelConfig(model_type="qwen3", vocab_size=4096, hidden_size=1024, intermediate_size=3072, num_layers=4,
                      num_heads=16, num_kv_heads=8, head_dim=128, max_position_embeddings=2048,
                      compute_dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    ids = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (4, 512)), jnp.int32)
    _, _, _, mask = qkv(4, 512)
    got, want = (np.asarray(jax.jit(lambda p, i, m, c=cfg.replace(attention=a): transformer.forward(p, c, i, m))(
        params, ids, mask), np.float32) for a in ("cudnn", "xla"))
    real = np.asarray(mask)[..., None]
    err = np.abs(np.where(real, got - want, 0)).max() / np.abs(np.where(real, want, 0)).max()
    print(f"decoder logits (4 layers, bf16): max |cudnn - xla| / max |xla| = {err:.4f} (bound 0.03)")
    return bool(err < 0.03)


def memory_and_time(b=2, t=6144) -> None:
    q, k, v, mask = qkv(b, t)
    for name, fn in (("xla", xla_attention), ("cudnn", fused_attention.cudnn_attention)):
        step = jax.jit(jax.value_and_grad(lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v, mask).astype(jnp.float32)),
                                          argnums=(0, 1, 2)))
        compiled = step.lower(q, k, v).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        jax.block_until_ready(compiled(q, k, v))
        start = time.perf_counter()
        for _ in range(5):
            out = compiled(q, k, v)
        jax.block_until_ready(out)
        ms = (time.perf_counter() - start) / 5 * 1e3
        print(f"one layer's attention fwd+bwd, {b} rows x {t} slots, 32/8 heads: {name:5s} "
              f"temporaries {temp / GiB:6.2f} GiB, {ms:7.2f} ms")


def main() -> int:
    print("devices:", jax.devices())
    if jax.default_backend() != "gpu":
        print("no GPU: this check needs JAX on an NVIDIA GPU")
        return 1
    ok = parity()
    repeated = not fused_attention.packed_keys_strided_by_kv_heads()
    kv = "k and v repeated to one head per query head" if repeated else "k and v as they are"
    print(f"jax {jax.__version__}: packed rows take {kv} (fused_attention.packed_keys_strided_by_kv_heads)")
    try:
        packed = packed_parity()
    except Exception as e:  # the packed layout needs a Hopper GPU and a recent cuDNN
        print(f"packed attention: {type(e).__name__}: {str(e)[:400]}")
        packed = False
    # scripts/gpu_rl_step.sh packs training rows on this line alone, whatever the rest of the check does.
    print("packed attention:", "OK" if packed else "MISMATCH")
    ok &= packed & decoder_parity()
    print("cudnn attention:", "OK" if ok else "MISMATCH")
    memory_and_time()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
