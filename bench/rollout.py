"""The continuous rollout schedule against the round schedule, side by side in one run.

Two workloads:

1. Synthetic, long-tailed responses: `bench/decode_windows.py`'s model (the tiny Qwen3's 4 x 256
   layers, a 512-token vocabulary of which 8 tokens stop a row, so responses average about a hundred
   tokens and a few run to the budget). `--requests` prompts go through `--slots` rows: the round
   schedule samples them `--slots` at a time, each call running to its longest response; the engine
   keeps its slots full from the queue.
2. Games: TicTacToe-v0, KuhnPoker-v1 and SimpleNegotiation-v1 in self-play through `Rollout`, one step's
   worth of games each. The model is random over a 64-token byte vocabulary, where 2 tokens stop a
   response (about 30 tokens of "text" on average); a stand-in tokenizer reads each response as one
   of the game's moves. The prompts are the games' real observations in bytes, so a game's turns
   share the observation's head as they do with a real tokenizer.

Both schedules sample the same tokens (asserted here, but for the odd row where float rounding moves
a draw across a token boundary). Slot utilization is the share of decode slot-steps that produced a
token; prefill saved is the share of prompt tokens whose keys a slot already held.

    python bench/rollout.py
    python bench/rollout.py --requests 128 --slots 16 --budget 512
"""
import argparse
import os
import time

import jax
import numpy as np

from spiral_jax.models import ModelConfig, init_params
from spiral_jax.rollout import Rollout
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.engine import DecodeEngine, Request
from spiral_jax.sampling.stats import DecodeStats

SYNTHETIC = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=256, intermediate_size=768, num_layers=4,
                        num_heads=8, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, rope_theta=1e6,
                        max_position_embeddings=8192)
GAMES = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=128, intermediate_size=384, num_layers=4,
                    num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=2048)
MOVES = {"TicTacToe-v0": [str(k) for k in range(9)],
         "KuhnPoker-v1": ["check", "bet", "call", "fold"],
         "SimpleNegotiation-v1": ["Accept", "Deny", "Offer: 1 Wood -> 1 Gold", "Offer: 2 Gold -> 3 Wood"]}


class MoveTokenizer:
    """Observation bytes in, one of the game's moves out (picked by the response's tokens)."""

    stop_ids = frozenset({0, 1})

    def __init__(self, moves):
        self.moves = moves

    def prompt_ids(self, observation):
        return [2 + b % 62 for b in observation.encode()]

    def decode(self, ids):
        return "\\boxed{%s}" % self.moves[sum(ids) % len(self.moves)]


def synthetic(args):
    params = init_params(SYNTHETIC, jax.random.key(0))
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, 100, (args.requests, 64)).tolist()
    sp = SamplingParams(max_new_tokens=args.budget, temperature=1.0, stop_token_ids=frozenset(range(100, 108)))
    sampler = Sampler(SYNTHETIC, max_prompt_len=64, max_cache_len=64 + args.budget)
    engine = DecodeEngine(sampler, sp, args.slots)

    def rounds():
        out, steps = [], 0
        for i in range(0, len(prompts), args.slots):
            res = sampler.generate(params, prompts[i:i + args.slots], sp, seed=1, row_ids=range(i, i + args.slots))
            out += res.tokens
            steps += res.stats.slot_steps
        return out, steps

    def continuous():
        queue, out = [Request(p, 1, i) for i, p in enumerate(prompts)], {}
        before = engine.stats
        while queue or engine.live:
            free = len(engine.free_slots())
            engine.insert(params, queue[:free])
            queue = queue[free:]
            out.update({f.request.row_id: f.tokens for f in engine.decode(params)})
        return [out[i] for i in range(len(prompts))], (engine.stats - before).slot_steps

    best, runs = {}, {}
    for repeat in range(args.repeats + 1):  # the first run compiles; the two take turns after it
        for name, run in (("rounds", rounds), ("continuous", continuous)):
            start = time.perf_counter()
            runs[name] = run()
            if repeat:
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    same = sum(a == b for a, b in zip(runs["rounds"][0], runs["continuous"][0]))
    # A row's logits differ by float rounding between batch compositions, so over ~10^5 tokens the odd
    # uniform draw lands on the other side of a token boundary; anything more is a bug.
    assert same >= 0.99 * len(prompts), f"the schedules sampled different tokens in {len(prompts) - same} rows"
    tokens = sum(len(t) for t in runs["rounds"][0])
    decoded = tokens - len(prompts)
    util = {name: decoded / steps for name, (_, steps) in runs.items()}
    print(f"\nsynthetic: {args.requests} prompts of 64 tokens, {args.slots} rows, budget {args.budget}, "
          f"{tokens} tokens (longest {max(len(t) for t in runs['rounds'][0])}); {same} of {len(prompts)} "
          f"rows sampled identically")
    print(f"{'schedule':>11} {'seconds':>8} {'tokens/s':>9} {'slot utilization':>17}")
    for name in ("rounds", "continuous"):
        print(f"{name:>11} {best[name]:>8.2f} {tokens / best[name]:>9.0f} {util[name]:>16.1%}")
    return util["continuous"], best["rounds"] / best["continuous"]


def games(args):
    params = {"model": init_params(GAMES, jax.random.key(0))}
    sampler = Sampler(GAMES, max_prompt_len=1024, max_cache_len=1024 + 128)
    sp = SamplingParams(max_new_tokens=128, temperature=1.0)
    print(f"\ngames: {args.games} self-play games per game type, random model (4 x 128, 64-token vocabulary); "
          f"continuous/N: N decode slots (else one per game)")
    print(f"{'game':>21} {'schedule':>15} {'moves':>6} {'tokens':>7} {'seconds':>8} {'tokens/s':>9} "
          f"{'slot util':>10} {'prefill saved':>14}")
    summary = DecodeStats()
    for env_id, moves in MOVES.items():
        ref = None
        for name, schedule, slots in (("rounds", "rounds", None), ("continuous", "continuous", None),
                                      (f"continuous/{args.slots // 2}", "continuous", args.slots // 2)):
            rollout = Rollout(sampler, MoveTokenizer(moves), sp, schedule=schedule, max_in_flight=slots)
            # The timed games once before: every program they need compiles here, not in the timing.
            rollout.play([env_id] * args.games, [("model", "model")] * args.games, params, seed=1)
            rollout = Rollout(sampler, MoveTokenizer(moves), sp, schedule=schedule, max_in_flight=slots)
            start = time.perf_counter()
            played = rollout.play([env_id] * args.games, [("model", "model")] * args.games, params, seed=1)
            seconds = time.perf_counter() - start
            turns = [[t.response_ids for t in g.model_turns] for g in played]
            assert ref is None or turns == ref, f"{env_id}: the schedules sampled different tokens"
            ref = turns
            stats = rollout.stats
            if slots:  # the summary's prefill saved: fewer slots than games, so slots pass between games
                summary += stats
            print(f"{env_id:>21} {name:>15} {sum(map(len, turns)):>6} {stats.generated_tokens:>7} {seconds:>8.2f} "
                  f"{stats.generated_tokens / seconds:>9.0f} {stats.slot_utilization:>10.1%} "
                  f"{stats.prefill_saved:>14.1%}")
    return summary.prefill_saved


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--budget", type=int, default=1024)
    parser.add_argument("--games", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {len(os.sched_getaffinity(0))} CPUs")
    util, ratio = synthetic(args)
    saved = games(args)
    print(f"\nslot utilization {util:.0%}, continuous/round tokens/s {ratio:.2f}x, prefill saved {saved:.0%}")


if __name__ == "__main__":
    main()
