"""Compiling programs one after another against compiling them on parallel threads.

Why the sampler compiles its smaller batch buckets ahead, and the learner its train step beside the
old-log-prob pass (`spiral_jax/sampling/ahead.py`): XLA compiles one program on about one core. This
lowers the programs without the accelerator (`spiral_jax.aot`), for one chip of an NVIDIA card or a
TPU slice: the sampler's for several batch buckets (a Qwen3 shape), or with --config that config's
train step and old-log-prob pass. It then compiles them from fresh lowerings, one after another and
on one thread each, in --repeats rounds that take turns (each round in the other order), and prints
the wall and CPU seconds of every compile and the ratio of the two modes' best wall times. The
parallel figure is bounded by this host's cores: on a 2-core machine it can be at most 2x.

    python bench/compile_ahead.py                                   # Qwen3-0.6B, batch 8 and 16, 1xH200
    python bench/compile_ahead.py --shape 4b --batch 16 8 4 2 1 --hardware 1xH200
    python bench/compile_ahead.py --config configs/kuhn_qwen3_4b_1xh200.py --hardware 1xH200
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import resource
import time

from spiral_jax import aot

MODES = ("one after another", "a thread each")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="0.6b", help="a Qwen3 shape (spiral_jax/models/shapes.py)")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 16], help="the batch buckets")
    parser.add_argument("--hardware", default="1xH200", help="an NVIDIA card or a TPU slice (spiral_jax/hardware.py)")
    parser.add_argument("--prompt", type=int, default=200, help="prompt tokens (bucketed)")
    parser.add_argument("--new_tokens", type=int, default=1024)
    parser.add_argument("--config", help="a run config: compile its train step and old-log-prob pass instead")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of both modes, in turn")
    args = parser.parse_args()
    aot.prepare(args.hardware)

    import jax
    import jax.numpy as jnp
    from spiral_jax.models.config import ModelConfig
    from spiral_jax.models.params import abstract_params
    from spiral_jax.models.shapes import QWEN3
    from spiral_jax.sampling import Sampler, SamplingParams

    tgt = aot.target(args.hardware)
    device = jax.sharding.SingleDeviceSharding(tgt.devices[0])
    platform = tgt.devices[0].platform
    with aot.compiling(tgt):
        if args.config:
            from spiral_jax.config import config_from_file
            from spiral_jax.rl.train_step import make_compute_logprobs, make_train_step
            from spiral_jax.run.setup import run_spec
            from spiral_jax.sharding import make_mesh

            spec = run_spec(config_from_file(args.config), planning=True)
            mesh = make_mesh(**spec.mesh, devices=tgt.devices)
            p = aot.run_plan(spec, tgt, mesh)
            state, batch, frozen, _ = aot.train_inputs(spec, p, mesh, platform)

            def lowerings():
                """Fresh lowerings: new jitted functions (JAX keeps a lowering's executable with it)."""
                return [make_train_step(p.cfg, spec.train, mesh).lower(state, batch, *frozen),
                        make_compute_logprobs(p.cfg, spec.train, mesh).lower(state.params, batch, *frozen)]

            what = (f"{args.config}: the train step and the old-log-prob pass ({batch.shape[0]} rows x "
                    f"{batch.shape[1]} slots)")
        else:
            cfg = ModelConfig(**QWEN3[args.shape], compute_dtype="bfloat16")
            params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32, sharding=device),
                                  abstract_params(cfg))

            def lowerings():
                """Fresh lowerings: a new sampler's programs (JAX keeps a lowering's executable with it)."""
                sampler = Sampler(cfg, max_prompt_len=args.prompt, max_cache_len=2 * args.prompt + args.new_tokens,
                                  compile_ahead=0)
                return [sampler.lower(params, [[1] * args.prompt] * b, SamplingParams(args.new_tokens))
                        for b in args.batch]

            what = (f"Qwen3-{args.shape} sampler programs, batch {args.batch}, prompt {args.prompt} + "
                    f"{args.new_tokens} new tokens")
        print(f"{what}, compiled for {tgt.name} ({tgt.devices[0].device_kind}) on a host of {os.cpu_count()} cores")
        times = {mode: float("inf") for mode in MODES}
        for round_ in range(args.repeats):  # the modes take turns, each round in the other order
            for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                lowered = lowerings()
                start, used = time.perf_counter(), cpu_seconds()
                if mode == MODES[0]:
                    for program in lowered:
                        program.compile()
                else:
                    with concurrent.futures.ThreadPoolExecutor(len(lowered)) as pool:
                        list(pool.map(lambda program: program.compile(), lowered))
                wall = time.perf_counter() - start
                times[mode] = min(times[mode], wall)
                print(f"  {mode:>18}: {wall:6.1f} s wall, {cpu_seconds() - used:6.1f} s CPU")
    sequential, parallel = (times[mode] for mode in MODES)
    print(f"best of {args.repeats}: {MODES[0]} {sequential:.1f} s, {MODES[1]} {parallel:.1f} s")
    print(f"parallel compiling: {sequential / parallel:.2f}x faster")


if __name__ == "__main__":
    main()
