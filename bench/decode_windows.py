"""Staged decode attention against reading the whole KV cache every step, side by side in one run.

RL rollouts ask for a large new-token budget (4096 in the paper's configs) while most games end after
a few hundred tokens. The sampler's decode attention reads only the filled part of the cache, in stages
of static size (`attention_windows`); this compares it with one stage over the whole cache (the
sampler before the stages). The model has the tiny Qwen3's layers (4 x 256, 8 heads, 2 KV heads) and a
512-token vocabulary with 8 stop tokens, so sampling at temperature 1 ends a row after about a hundred
tokens (93 on average when measured) and a batch of 32 after a few hundred: the shape of a rollout,
not of a throughput test.
The first call's time (compile included) shows what the extra stages cost in compilation.

    python bench/decode_windows.py
    python bench/decode_windows.py --budgets 1024 --batch 8
"""
import argparse
import os
import time

import jax
import numpy as np

from spiral_jax.models import ModelConfig, init_params
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling import sampler as sampler_module

CFG = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=256, intermediate_size=768, num_layers=4,
                  num_heads=8, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, rope_theta=1e6,
                  max_position_embeddings=8192)
STOP = frozenset(range(100, 108))
PROMPT_LEN = 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budgets", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    params = init_params(CFG, jax.random.key(0))
    rows = np.random.default_rng(0).integers(0, 100, (args.batch, PROMPT_LEN)).tolist()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {len(os.sched_getaffinity(0))} CPUs; "
          f"batch {args.batch}, prompt {PROMPT_LEN}, temperature 1, 8 of 512 tokens stop a row")
    print(f"{'budget':>6} {'stages':>7} {'tokens':>7} {'longest':>7} {'staged s':>9} {'whole s':>8} {'ratio':>6}"
          f" {'1st call: staged s':>19} {'whole s':>8}")
    for budget in args.budgets:
        sp = SamplingParams(max_new_tokens=budget, temperature=1.0, stop_token_ids=STOP)
        runs, first = {}, {}  # "whole": a first window past any budget, so one stage over the cache
        for name, sampler in (("staged", Sampler(CFG)), ("whole", Sampler(CFG, first_window=10**9))):
            start = time.perf_counter()
            runs[name] = (sampler, sampler.generate(params, rows, sp, seed=0))
            first[name] = time.perf_counter() - start
        assert runs["staged"][1].tokens == runs["whole"][1].tokens, "the stages changed the tokens"
        best = dict.fromkeys(runs, float("inf"))
        for repeat in range(args.repeats):  # the two take turns, so a slow spell hits both
            for name, (sampler, _) in runs.items():
                start = time.perf_counter()
                sampler.generate(params, rows, sp, seed=0)
                best[name] = min(best[name], time.perf_counter() - start)
        lengths = [len(t) for t in runs["staged"][1].tokens]
        stages = len(sampler_module.attention_windows(PROMPT_LEN, sampler_module.cache_slots(PROMPT_LEN, budget)))
        print(f"{budget:>6} {stages:>7} {sum(lengths):>7} {max(lengths):>7} {best['staged']:>9.3f} "
              f"{best['whole']:>8.3f} {best['whole'] / best['staged']:>5.2f}x {first['staged']:>19.2f} "
              f"{first['whole']:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
