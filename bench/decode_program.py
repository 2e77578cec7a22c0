"""The sampler's decode step as XLA's GPU or TPU compiler builds it, without the accelerator.

Compiles the sampler's program (prefill and the staged decode loops) for one chip of an NVIDIA card
or a TPU slice (`spiral_jax.aot`: JAX's CUDA plugin, `pip install -e '.[cuda]'`, or libtpu), then
reads the compiled HLO: the kernels one decode step launches (the loop body, the layer loop counted
once per layer where the compiler states its trip count), whole-cache transposes, copies of weights
out of stacked layers and of the KV cache, the dtype of the weights the decode loop carries, and the
program's temporaries; on a GPU also what its thunk sequence runs outside CUDA graphs (loops whose
condition the host reads back each step, kernels launched one by one). A decode step is bound by
reading its weights and cache, so each of these shows up in the time a run measures; this finds
them before one.

    python bench/decode_program.py                          # Qwen3-4B, batch 1 and 32, on 1xH200
    python bench/decode_program.py --shape 0.6b --batch 64 --hardware 1xH100
    python bench/decode_program.py --shape 8b --lora 64 --hardware 1xH100   # a merged LoRA policy
    python bench/decode_program.py --lora 32 --sample adapters --hardware 1x4090 --no-scan_layers
    python bench/decode_program.py --engine --batch 64                      # the continuous schedule
    python bench/decode_program.py --shape 0.6b --batch 32 --hardware v5p-8  # one TPU v5p chip
    python bench/decode_program.py --hardware v5p-8 --attention xla          # without the Pallas kernels
"""
from __future__ import annotations

import argparse
import atexit
import collections
import functools
import math
import os
import re
import shutil
import tempfile
from pathlib import Path

from spiral_jax import aot, hardware

from hlo import KERNELS, computations, condition_bound, graph_launches, kernel_bytes, kernels, opcode, result_shapes


def _large(line: str, kind: str, rank: int | None = None) -> bool:
    """Whether the instruction's name has `kind` in it and its result (an element of it) has a million
    elements or more: a weight or the KV cache, not a row of the cache or a prefill's activations.
    rank: of that result, if given (5: the KV cache's [layers, rows, KV heads, slots, head_dim])."""
    name = line.split(" = ", 1)[0].lstrip("%")
    return kind in name and any(math.prod(dims) >= 2**20 and rank in (None, len(dims))
                                for dims in result_shapes(line))


def _out_of_stack(line: str) -> bool:
    """Whether the instruction is a slice kernel whose result is one layer of a stacked weight, its
    leading (layer) axis kept at size 1, a million elements or more: a static slice (an unrolled
    loop's `wrapped_slice`) or a dynamic one (a scanned loop's `dynamic_slice_fusion`)."""
    return _large(line, "slice") and any(len(dims) in (3, 4) and dims[0] == 1 for dims in result_shapes(line))


def dump_thunks() -> Path:
    """Have XLA:GPU dump each program it compiles (call before JAX starts its backends): its thunk
    sequence says what runs inside CUDA graphs, which the HLO does not. A dump directory already in
    XLA_FLAGS is used as it is."""
    found = re.search(r"--xla_dump_to=(\S+)", os.environ.get("XLA_FLAGS", ""))
    if found:
        return Path(found.group(1))
    dump = tempfile.mkdtemp(prefix="decode_program_dump_")
    atexit.register(shutil.rmtree, dump, ignore_errors=True)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}".strip()
    return Path(dump)


def newest_thunks(dump: Path) -> str | None:
    """The thunk sequence of the module XLA:GPU dumped last, after its thunk passes where they changed
    it (XLA writes that file only then)."""
    files = list(dump.glob("module_*.thunk_sequence*.txt"))
    if not files:
        return None
    module = max(files, key=lambda f: f.stat().st_mtime_ns).name.split(".")[0]
    ours = [f for f in files if f.name.split(".")[0] == module]
    after = [f for f in ours if f.name.endswith("thunk_sequence_after_thunk_passes.txt")]
    return (after or ours)[0].read_text()


def _estimated_cycles(line: str) -> int:
    """The TPU compiler's cost-model estimate of the kernel's cycles, stated in its backend config; 0
    where there is none (custom calls: the Pallas kernels; XLA:GPU states none)."""
    found = re.search(r'"estimated_cycles":"(\d+)"', line)
    return int(found.group(1)) if found else 0


def step_kernels(comps, body: str, cycles: bool = False) -> collections.Counter:
    """Kernels one run of `body` launches by kind, nested known-trip-count loops (the layers) multiplied
    out; cycles: the compiler's estimate of their cycles instead (`_estimated_cycles`)."""
    count = collections.Counter()
    for line in comps[body]:
        op = opcode(line)
        if op == "while":
            trips = re.search(r'known_trip_count":\{"n":"(\d+)"', line)
            inner = step_kernels(comps, re.search(r"body=%?([\w.\-]+)", line).group(1), cycles)
            for k, v in inner.items():
                count[k] += v * (int(trips.group(1)) if trips else condition_bound(comps, line))
        elif op in KERNELS:
            updates = _large(line, "update_slice") or _large(line, "update-slice")  # in place
            cache = _large(line, "slice", rank=5) or (op == "copy" and _large(line, "copy", rank=5))
            kind = ("cache copy" if cache and not updates else
                    "weight copy out of a stack" if _out_of_stack(line) and not updates else op)
            count[kind] += _estimated_cycles(line) if cycles else 1
    return count


def step_bytes(comps, body: str) -> int:
    """Bytes one run of `body` reads and writes in its kernels (`hlo.kernel_bytes`), nested loops (the
    layers, where scanned) multiplied out."""
    return sum(kernel_bytes(comps, line, types) * runs for line, types, runs in kernels(comps, body))


def engine_decode(sampler, params, slots: int, new_tokens: int, device):
    """The decode engine's compiled decode call on `slots` slots, given the weights a continuous rollout
    hands it (`DecodeSetup.decode_weights`), attending over the whole cache."""
    import jax
    from spiral_jax.sampling import SamplingParams
    from spiral_jax.sampling.engine import DecodeEngine

    engine = DecodeEngine(sampler, SamplingParams(new_tokens), slots)
    place = lambda tree: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), tree)  # noqa: E731
    weights = place(jax.eval_shape(sampler.setup.decode_weights, params))
    state = place(jax.eval_shape(engine._programs.empty))
    steps = jax.ShapeDtypeStruct((), jax.numpy.int32, sharding=device)
    return engine._programs.decode.lower(weights, state, steps, steps, window=engine.cache_len).compile()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4b", help="a Qwen3 shape (spiral_jax/models/shapes.py)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--hardware", default="1xH200", help="an NVIDIA card or a TPU slice, one chip of which "
                        "runs the program (spiral_jax/hardware.py)")
    parser.add_argument("--scan_layers", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--attention", default="auto", help="model.attention: auto, or xla for XLA's decode "
                        "attention on a TPU instead of the Pallas kernels")
    parser.add_argument("--decode_attention", default="auto", help="model.decode_attention: auto, pallas (the "
                        "Pallas kernel on a GPU too) or xla")
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--new_tokens", type=int, default=4096)
    parser.add_argument("--engine", action="store_true",
                        help="the decode engine's step (the continuous schedule) instead of the sampler's")
    parser.add_argument("--lora", type=int, default=0, metavar="RANK",
                        help="decode what a LoRA run of this rank hands the sampler (see --sample)")
    parser.add_argument("--sample", choices=["merged", "adapters"], default="merged",
                        help="with --lora: the merged policy, or the frozen weights and adapters side by side")
    args = parser.parse_args()
    dump = dump_thunks() if hardware.hardware(args.hardware).card is not None else None
    aot.prepare(args.hardware)

    import jax
    import jax.numpy as jnp
    from spiral_jax.models.config import ModelConfig
    from spiral_jax.models.params import abstract_params
    from spiral_jax.models.shapes import QWEN3
    from spiral_jax.rl.reshard import make_policy, sample_config, split_frozen
    from spiral_jax.sampling import Sampler, SamplingParams

    tgt = aot.target(args.hardware)
    device = jax.sharding.SingleDeviceSharding(tgt.devices[0])
    cfg = ModelConfig(**QWEN3[args.shape], compute_dtype="bfloat16", scan_layers=args.scan_layers,
                      lora_rank=args.lora, attention=args.attention,
                      decode_attention=args.decode_attention)
    platform = tgt.devices[0].platform
    with aot.compiling(tgt):
        params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, jnp.float32), abstract_params(cfg))
        given = "fp32 parameters (the train state's, handed over as they are)"
        if args.lora:  # what the trainer hands over: the frozen bf16 weights and the fp32 adapters
            merged = args.sample == "merged"
            frozen, adapters = jax.eval_shape(functools.partial(split_frozen, cfg, mesh=None), params)
            params = jax.eval_shape(make_policy(cfg, None, merged), adapters, frozen)
            given = "merged LoRA parameters" if merged else "frozen bf16 weights beside fp32 LoRA adapters"
            cfg = sample_config(cfg, merged)
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), params)
    weight_bytes = cfg.num_params * jnp.dtype(cfg.compute_dtype).itemsize
    cache_len = args.prompt + args.new_tokens
    cache_token_bytes = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.compute_dtype).itemsize
    print(f"Qwen3-{args.shape} ({cfg.num_layers} layers, scan_layers {args.scan_layers}), {given}, bf16 "
          f"compute, prompt {args.prompt} + {args.new_tokens} new tokens, compiled for {tgt.name} "
          f"({tgt.devices[0].device_kind}); bf16 weights {weight_bytes / 1e9:.2f} GB")
    for batch in args.batch:
        with aot.compiling(tgt):
            sampler = Sampler(cfg, max_prompt_len=args.prompt, max_cache_len=args.prompt + args.new_tokens)
            if args.engine:
                compiled = engine_decode(sampler, params, batch, args.new_tokens, device)
            else:
                prompts = [[1] * args.prompt] * batch
                compiled = sampler.lower(params, prompts, SamplingParams(args.new_tokens)).compile()
        hlo = compiled.as_text()
        comps = computations(hlo)
        entry = next(name for name in comps if hlo.find(f"ENTRY %{name} ") >= 0)
        loops = [line for line in comps[entry] if opcode(line) == "while"]
        stages = [step_kernels(comps, re.search(r"body=%?([\w.\-]+)", loop).group(1)) for loop in loops]
        kernels = stages[-1]  # the last decode stage: the whole cache in its window
        # Arrays of a million elements or more that the loop carries, but the 5-axis KV cache: the weights.
        carried = [(dtype, dims) for dtype, dims in re.findall(r"(\w+)\[([\d,]+)\]", loops[-1].split(" while(")[0])
                   if dims.count(",") < 4 and math.prod(map(int, dims.split(","))) >= 2**20]
        dtypes = collections.Counter(dtype for dtype, _ in carried)
        transposes = sum(1 for line in comps[entry] if _large(line, "transpose"))
        print(f"\nbatch {batch}: {sum(kernels.values())} kernels a decode step ({dict(kernels.most_common())})")
        print(f"  weights the decode loop carries: {dict(dtypes)}; "
              f"large transposes outside the loops: {transposes}; "
              f"cache copies a step in each loop (a scanned prefill, the decode stages): "
              f"{[stage['cache copy'] for stage in stages]}; "
              f"temporaries {compiled.memory_analysis().temp_size_in_bytes / 2**30:.2f} GiB")
        body = re.search(r"body=%?([\w.\-]+)", loops[-1]).group(1)
        if platform == "gpu":  # a TPU's Pallas attention takes the whole cache, of which it reads the window
            floor = weight_bytes + batch * cache_len * cache_token_bytes
            moved = step_bytes(comps, body)
            print(f"  bytes a decode step's kernels read and write (the last stage, the whole cache its window): "
                  f"{moved / 1e9:.3f} GB, {moved / floor:.2f}x its floor ({weight_bytes / 1e9:.2f} GB of weights and "
                  f"{(floor - weight_bytes) / 1e9:.3f} GB of cache)")
            branches = sum(1 for line in comps[body] if opcode(line) == "conditional")
            print(f"  conditionals a decode step: {branches} (XLA:GPU runs each from the host, reading its "
                  f"predicate back: a sync that splits the step's CUDA graph, beside the loop's own condition)")
            thunks = newest_thunks(dump)
            if thunks is not None:
                launches = graph_launches(thunks)
                print(f"  CUDA graphs in the program: {launches['graphs']}; loops run from the host (each step "
                      f"reads its condition back): {launches['host_loops']}; kernels launched outside graphs: "
                      f"{launches['host_kernels']}")
        cycles = step_kernels(comps, body, cycles=True)
        if sum(cycles.values()):
            print(f"  the compiler's cost model: {sum(cycles.values()) / 1e6:.2f} M cycles a decode step, "
                  f"{cycles['cache copy'] / sum(cycles.values()):.0%} of them cache copies (its estimate covers "
                  f"XLA's kernels, not custom calls: {kernels['custom-call']} a step)")


if __name__ == "__main__":
    main()
