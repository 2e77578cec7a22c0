"""The train step as XLA's GPU compiler builds it, without a GPU: what it computes and moves.

Compiles a run's train step (one optimizer step over the plan's rows, its micro-batches accumulated)
for NVIDIA cards (`spiral_jax.aot`: JAX's CUDA plugin, `pip install -e '.[cuda]'`), as `spiral-jax
plan --compile` does, and reads the compiled HLO (bench/hlo.py). It prints the FLOPs of the step's
matrix products, each loop's body counted by its trip count, split by part (the layers, the
unembedding), by pass (the forward, the forward that remat runs again inside the backward, the
backward) and by operand dtypes; the bytes its other kernels read and write, against the card's
bandwidth; and the model FLOPs that `bench/rl_step.py`'s MFU counts for the same batch with every
slot real (attention left out on both sides). A run's MFU is at most their ratio times the share of
the device's peak at which it runs the step, so this says what the MFU target asks of the kernels
before a GPU measures them. An fp32 product in a bf16 step (tensor cores run it at a fraction of the
bf16 rate) shows up here too.

    python bench/train_program.py                                  # Qwen3-4B on 1xH200, 16 samples a row
    python bench/train_program.py --samples_per_row 1              # one sample a row
    python bench/train_program.py --config configs/kuhn_qwen3_4b_8xh100.py --hardware 8xH100

The plan's rows are those of its worst case, every sample as long as the longest row (128 rows for
the paper's recipe); packed at the paper's lengths a step fills fewer (docs/performance.md), with the
same products a row. XLA:TPU writes its products as convolutions, which this does not read.
"""
from __future__ import annotations

import argparse
import collections
import math
import re
import time
from pathlib import Path

from spiral_jax import aot
from spiral_jax.hardware import hardware

from hlo import computations, entry, kernel_bytes, kernels, multiplicities, opcode, result_shapes, result_types

ROOT = Path(__file__).resolve().parents[1]
PASSES = ("forward", "recomputed", "backward")


def product_flops(hlo: str, vocab: int, devices: int = 1) -> collections.Counter:
    """FLOPs of every `dot` of a compiled HLO module, by (part, pass, operand dtypes): "unembedding"
    where an operand or the result has an axis of the vocabulary or of its share on some of the
    `devices`, else "layers"; the pass from the op's JAX name (remat's recomputed forward is a
    `rematted_computation` inside the transpose)."""
    shares = {f"{vocab // k}" for k in range(1, devices + 1) if devices % k == 0 and vocab % k == 0}
    comps = computations(hlo)
    runs = multiplicities(comps, entry(hlo))
    flops = collections.Counter()
    for name, lines in comps.items():
        if not runs[name]:
            continue
        types = result_types(lines)
        for line in lines:
            if opcode(line) != "dot":
                continue
            operands = [types[o] for o in re.findall(r"%([\w.\-]+)", line.split(" dot(", 1)[1].split(")")[0])]
            (lhs_type, lhs_dims), (rhs_type, _) = (re.match(r"(\w+)\[([\d,]*)\]", o).groups() for o in operands[:2])
            lhs = [int(d) for d in lhs_dims.split(",") if d]
            contracted = [int(d) for d in re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line).group(1).split(",") if d]
            jax_name = re.search(r'op_name="([^"]*)"', line)
            jax_name = jax_name.group(1) if jax_name else ""
            step = ("recomputed" if "rematted_computation" in jax_name else
                    "backward" if "transpose(" in jax_name else "forward")
            axes = set(re.findall(r"\d+", " ".join(t.split("]")[0] for t in [line.split(" = ", 1)[1], *operands])))
            part = "unembedding" if axes & shares else "layers"
            flops[(part, step, f"{lhs_type} x {rhs_type}")] += 2 * math.prod(result_shapes(line)[0]) * math.prod(
                lhs[i] for i in contracted) * runs[name]
    return flops


def other_traffic(hlo: str) -> tuple[int, int]:
    """(kernels, bytes they read and write) of one run of the module's kernels other than products
    and attention (gemm fusions, custom calls), each counted as often as its loops run it
    (`hlo.kernel_bytes`)."""
    comps = computations(hlo)
    count = total = 0
    for line, types, runs in kernels(comps, entry(hlo)):
        if opcode(line) != "custom-call" and "gemm" not in line.split(" = ", 1)[0]:
            count += runs
            total += kernel_bytes(comps, line, types) * runs
    return count, total


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs" / "kuhn_qwen3_4b_1xh200.py"))
    parser.add_argument("--hardware", default="1xH200", help="an NVIDIA preset: 1xH200, 8xH100, 1x4090, ...")
    parser.add_argument("--samples_per_row", type=int, default=16, help="optim.samples_per_row (0: the platform's default)")
    args = parser.parse_args()
    if hardware(args.hardware).card is None:
        parser.error(f"--hardware {args.hardware} is not an NVIDIA card; this reads XLA:GPU's programs")
    aot.prepare(args.hardware)

    from step_costs import train_flops
    from spiral_jax.config import config_from_file
    from spiral_jax.rl.train_step import make_train_step
    from spiral_jax.run.setup import run_spec
    from spiral_jax.sharding import make_mesh

    c = config_from_file(args.config)
    c.optim.samples_per_row = args.samples_per_row
    spec = run_spec(c, planning=True)
    tgt = aot.target(args.hardware)
    platform = tgt.devices[0].platform
    with aot.compiling(tgt):
        mesh = make_mesh(**spec.mesh, devices=tgt.devices)
        p = aot.run_plan(spec, tgt, mesh)
        state, batch, frozen, packed = aot.train_inputs(spec, p, mesh, platform)
        start = time.perf_counter()
        compiled = make_train_step(p.cfg, spec.train, mesh).lower(state, batch, *frozen).compile()
        seconds = time.perf_counter() - start
    cfg = p.cfg
    rows, slots = batch.tokens.shape
    response = batch.response_slots.shape[1]
    print(f"{Path(args.config).name} on {tgt.name} ({len(tgt.devices)} devices): {cfg.num_params / 1e9:.2f}B "
          f"parameters, {cfg.compute_dtype} compute, {cfg.remat_summary}, scan_layers "
          f"{'on' if cfg.scan_layers else 'off'}; train step of {rows} "
          f"rows x {slots} slots ({response} unembedded a row), micro-batch {p.work.micro_batch}, up to {packed} "
          f"sample{'s' * (packed > 1)} a row; compiled in {seconds:.1f} s, peak "
          f"{compiled.memory_analysis().peak_memory_in_bytes / 2**30:.2f} GiB a device")

    hlo = compiled.as_text()
    flops = product_flops(hlo, cfg.vocab_size, len(tgt.devices))
    total = sum(flops.values())
    print(f"\nthe step's matrix products, TFLOP (all devices: {len(tgt.devices)} x what one computes):")
    for (part, step, dtypes), f in sorted(flops.items(), key=lambda kv: (kv[0][0], PASSES.index(kv[0][1]), kv[0][2])):
        print(f"  {part:12s} {step:11s} {dtypes:12s} {f * len(tgt.devices) / 1e12:9.1f}  {f / total:6.1%}")
    fp32 = sum(f for (_, _, dtypes), f in flops.items() if "f32 x" in dtypes or "x f32" in dtypes)
    computed = total * len(tgt.devices)
    model = train_flops(cfg, [(slots, response)] * rows, passes=3, attention=False)
    print(f"  {'all':36s} {computed / 1e12:9.1f}")
    print(f"\nproducts with an fp32 operand: {fp32 / total:.1%} of the FLOPs")
    kernels, moved = other_traffic(hlo)
    card = hardware(args.hardware).card
    print(f"its other kernels (elementwise, norms, slices, copies; attention left out): {kernels:,} a step, "
          f"{moved * len(tgt.devices) / 1e12:.2f} TB read and written: {moved / card.bandwidth:.2f} s at the "
          f"{card.kind}'s {card.bandwidth / 1e12:.1f} TB/s, against {total / card.bf16_flops:.2f} s for the "
          f"products at its {card.bf16_flops / 1e12:.0f} TFLOP/s")
    print(f"MFU's model FLOPs of this batch, every slot real: {model / 1e12:.1f} TFLOP, {model / computed:.0%} of what "
          f"the step computes; a run's MFU is at most {model / computed:.2f} x the share of peak at which it runs "
          f"them, times the share of its slots that are real")


if __name__ == "__main__":
    main()
