"""Train-step time and tokens/s, and the trainer -> sampler parameter hand-over, on CPU.

Random Qwen3 models: a tiny one (4 layers, hidden 256, 8 heads, 2 KV heads, vocab 32000) and one shaped
like Qwen3-0.6B (28 layers, hidden 1024, 16/8 heads, head_dim 128, MLP 3072, vocab 151936, tied).
Rows are 128 prompt + 128 response tokens (a 256-slot bucket), fp32, per-layer remat, REINFORCE,
micro-batches accumulated in the step. The step runs on one device; the hand-over (the jitted
reshard from the TRAIN to the SAMPLE layout) on a mesh of 8 fake CPU devices.

    python bench/train_step.py               # both models (the 0.6B shape takes a few minutes)
    python bench/train_step.py --only tiny
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from spiral_jax.models import ModelConfig, init_params  # noqa: E402
from spiral_jax.rl.reshard import make_reshard  # noqa: E402
from spiral_jax.rl.samples import TurnSample, pack, shard_batch  # noqa: E402
from spiral_jax.rl.train_step import TrainConfig, init_train_state, make_train_step  # noqa: E402
from spiral_jax.sharding import make_mesh  # noqa: E402

QWEN3 = dict(model_type="qwen3", qk_norm=True, tie_word_embeddings=True, rope_theta=1e6)
MODELS = {
    # name: (config, rows, micro-batch rows, hand-over mesh (data, fsdp, tensor))
    "tiny": (ModelConfig(vocab_size=32000, hidden_size=256, intermediate_size=768, num_layers=4,
                         num_heads=8, num_kv_heads=2, head_dim=32, **QWEN3), 16, 8, (2, 2, 2)),
    "0.6b": (ModelConfig(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                         num_heads=16, num_kv_heads=8, head_dim=128, **QWEN3), 4, 2, (1, 2, 4)),
}
PROMPT, RESPONSE = 128, 128


def _batch(cfg: ModelConfig, rows: int, micro: int):
    rng = np.random.default_rng(0)
    samples = [TurnSample(rng.integers(0, cfg.vocab_size, PROMPT).tolist(),
                          rng.integers(0, cfg.vocab_size, RESPONSE).tolist(), [-1.0] * RESPONSE, "bench",
                          i % 2, 0, float(rng.choice([-1.0, 1.0]))) for i in range(rows)]
    return shard_batch(pack(samples, row_multiple=micro), None)


def _timed(fn, repeats: int) -> tuple[float, list[float]]:
    """(first call incl. compile, later calls) in seconds."""
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times[0], times[1:]


def bench_step(name: str, steps: int):
    cfg, rows, micro, _ = MODELS[name]
    tc = TrainConfig(learning_rate=1e-6, micro_batch_size=micro, logprob_chunk=128)
    batch = _batch(cfg, rows, micro)
    state = init_train_state(init_params(cfg, jax.random.key(0)), cfg, tc)
    step = make_train_step(cfg, tc)
    holder = {"state": state}

    def run():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics

    first, later = _timed(run, steps)
    t = float(np.median(later))
    slots = batch.tokens.size
    print(f"{name:6s} {cfg.num_params / 1e6:8.1f}M {rows:3d} x {batch.tokens.shape[1]:4d} "
          f"{rows // micro:5d} {first:9.1f} {t:9.3f} {slots / t:10,.0f} {RESPONSE * rows / t:10,.0f}")


def bench_handover(name: str, repeats: int):
    cfg, _, _, shape = MODELS[name]
    mesh = make_mesh(*shape)
    params = init_params(cfg, jax.random.key(0), mesh=mesh)
    reshard = make_reshard(cfg, mesh)
    holder = {}

    def run():
        holder.pop("out", None)  # free the previous sampler copy first, as a training step would
        holder["out"] = reshard(params)
        return holder["out"]

    first, later = _timed(run, repeats)
    t = float(np.median(later))
    gb = cfg.num_params * 4 / 1e9
    print(f"{name:6s} {'x'.join(map(str, shape)):>6s} {gb:8.2f} {first:9.2f} {t * 1e3:9.1f} {gb / t:8.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(MODELS), help="one model only")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the compiling one")
    args = parser.parse_args()
    names = [args.only] if args.only else list(MODELS)
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {os.cpu_count()} CPUs; fp32, remat per "
          f"layer, prompt {PROMPT} + response {RESPONSE}")
    print("\ntrain step (one device; median of the timed steps)")
    print(f"{'model':6s} {'params':>9s} {'rows x T':>10s} {'micro':>5s} {'first s':>9s} {'step s':>9s} "
          f"{'slots/s':>10s} {'resp tok/s':>10s}")
    for name in names:
        bench_step(name, args.steps if name == "tiny" else min(args.steps, 1))
    print("\ntrainer -> sampler hand-over (TRAIN -> SAMPLE layout, 8 fake CPU devices)")
    print(f"{'model':6s} {'mesh':>6s} {'fp32 GB':>8s} {'first s':>9s} {'ms':>9s} {'GB/s':>8s}")
    for name in names:
        bench_handover(name, 5)


if __name__ == "__main__":
    main()
