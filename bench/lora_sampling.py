"""LoRA sampling: the adapters merged into the weights once per step, against applied in the forward.

The trainer hands its sampler either merged weights (W + scale * B A, one fold per RL step, a second
copy of the weights while it samples; model.lora.sample="merged") or the frozen weights and the
adapters as they are (two thin products more per projection and token, no copy; "adapters"). Both
sample the same tokens to float tolerance (checked here). This prints, per batch size, the tokens/s
of a whole generate call each way (the best of --repeats rounds that take turns), the merge's own
time, and the ratio, on a random Qwen3 (the 4 x 256 layers of bench/decode_windows.py, rank 32 on
every projection) with no stop token, so every row runs to --new tokens.

    python bench/lora_sampling.py
    python bench/lora_sampling.py --rank 16 --new 256 --batches 1 16 64
"""
import argparse

import jax
import numpy as np

from spiral_jax.models import ModelConfig, init_params, lora
from spiral_jax.sampling import Sampler, SamplingParams
from timing import best_of_interleaved, timed  # bench/timing.py

SHAPE = dict(model_type="qwen3", vocab_size=2048, hidden_size=256, intermediate_size=768, num_layers=4,
             num_heads=8, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=4096)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--new", type=int, default=128, help="new tokens per row")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    cfg = ModelConfig(**SHAPE, lora_rank=args.rank, lora_alpha=2.0 * args.rank)
    base = init_params(cfg.base(), jax.random.key(0))
    adapters = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(jax.random.key(1), x.shape),
                            lora.init_adapters(cfg, jax.random.key(2)))
    merge = jax.jit(lambda b, a: lora.merge(lora.join(b, a), cfg))
    sp = SamplingParams(args.new, 1.0)
    merged_sampler, adapter_sampler = (Sampler(c, max_prompt_len=64, max_cache_len=64 + args.new)
                                       for c in (cfg.base(), cfg))
    rng = np.random.default_rng(0)
    jax.block_until_ready(merge(base, adapters))  # compile
    merge_s = min(timed(lambda: jax.block_until_ready(merge(base, adapters))) for _ in range(args.repeats))
    merged = merge(base, adapters)
    joined = lora.join(base, adapters)
    print(f"random Qwen3 4 x 256, LoRA rank {args.rank} on every projection, {args.new} new tokens a row, "
          f"{jax.devices()[0].platform}; merging once: {merge_s * 1e3:.1f} ms\n")
    print(f"{'rows':>5} {'merged tok/s':>13} {'adapters tok/s':>15} {'adapters / merged':>18} "
          f"{'merged incl. the fold':>22}")
    for rows in args.batches:
        prompts = [rng.integers(8, cfg.vocab_size, 40).tolist() for _ in range(rows)]
        a = merged_sampler.generate(merged, prompts, sp, seed=1)
        b = adapter_sampler.generate(joined, prompts, sp, seed=1)
        same = sum(x == y for x, y in zip(a.tokens, b.tokens))
        assert same >= rows - max(1, rows // 8), f"merged and adapters sample different tokens ({same}/{rows} rows)"
        # Both programs are compiled by the calls above; the timed rounds take turns.
        t = best_of_interleaved({"merged": lambda: merged_sampler.generate(merged, prompts, sp, seed=1),
                                 "adapters": lambda: adapter_sampler.generate(joined, prompts, sp, seed=1)},
                                args.repeats)
        t_merged, t_adapters = t["merged"], t["adapters"]
        tokens = rows * args.new
        print(f"{rows:5d} {tokens / t_merged:13.0f} {tokens / t_adapters:15.0f} {t_merged / t_adapters:17.2f}x "
              f"{tokens / (t_merged + merge_s):22.0f}")


if __name__ == "__main__":
    main()
