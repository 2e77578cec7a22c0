"""Train-step time by micro-batch size, for a config's model on its own bootstrap batches, on CPU.

On a CPU a smaller micro-batch can be faster for the same gradient: a layer's activations for fewer
rows stay in cache through the forward and backward passes. This measures it on the config's model
and a batch of its bootstrap's imitation samples (64 turns of TicTacToe for the main job), one
device, each size's step compiled first and then timed in interleaved rounds (the median is printed,
so a slow moment of the machine hits every size alike).

    python bench/micro_batches.py
    python bench/micro_batches.py --config configs/tiny_kuhn.py --sizes 0,32,16,8
"""
import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from spiral_jax.config import config_from_file
from spiral_jax.run.build import build_model, build_tokenizer
from spiral_jax.run.setup import run_spec
from spiral_jax.rl.bootstrap import imitation_samples
from spiral_jax.rl.samples import pack
from spiral_jax.rl.train_step import init_train_state, make_train_step


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny_tictactoe.py")
    parser.add_argument("--sizes", default="0,32,16,8", help="micro-batch rows; 0 is the whole batch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="steps timed per size and round")
    args = parser.parse_args()

    c = config_from_file(args.config)
    spec = run_spec(c)
    cfg, params = build_model(spec)
    tokenizer = build_tokenizer(spec, cfg)
    b = c.bootstrap
    samples = imitation_samples(c.games.env_ids, c.games.weights, tokenizer, b.batch_size, seed=0,
                                explore=b.explore, teacher=b.teacher, hash_uniform=b.hash_uniform)
    rows = len(samples)
    batch = jax.tree.map(jnp.asarray, pack(samples, rows=rows, row_multiple=rows))
    print(f"{args.config}: {rows} rows x {batch.tokens.shape[1]} slots, {jax.device_count()} device(s)")

    sizes = [int(s) for s in args.sizes.split(",")]
    steps, states, times = {}, {}, {s: [] for s in sizes}
    for size in sizes:
        tc = dataclasses.replace(spec.bootstrap.train, micro_batch_size=size or None)
        steps[size] = make_train_step(cfg, tc)
        states[size] = init_train_state(jax.tree.map(jnp.copy, params), cfg, tc)
        states[size], _ = steps[size](states[size], batch)  # compile
        jax.block_until_ready(states[size])
    for _ in range(args.rounds):
        for size in sizes:
            start = time.perf_counter()
            for _ in range(args.steps):
                states[size], _ = steps[size](states[size], batch)
            jax.block_until_ready(states[size])
            times[size].append((time.perf_counter() - start) / args.steps)

    whole = np.median(times[sizes[0]])
    print(f"{'micro-batch rows':>16} {'ms/step':>8} {'vs ' + (str(sizes[0]) if sizes[0] else 'whole'):>9}")
    for size in sizes:
        t = np.median(times[size])
        print(f"{size or 'whole':>16} {t * 1e3:8.1f} {whole / t:8.2f}x")


if __name__ == "__main__":
    main()
