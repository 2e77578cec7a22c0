"""Compile every preset's programs ahead of time for its hardware and print docs/memory.md's table.

    python scripts/compile_presets.py                      # every preset, fused attention (the default)
    python scripts/compile_presets.py --platform gpu       # the NVIDIA presets only (or tpu)
    python scripts/compile_presets.py --attention xla      # the XLA attention path, for comparison
    python scripts/compile_presets.py kuhn_qwen3_4b_v5p_8  # some presets only
    python scripts/compile_presets.py --micro_batch 16 kuhn_qwen3_4b_v5p_8   # another micro-batch

Each row: the preset, its hardware, the planner's peak per device, the compiler's (the program with
the largest footprint, what stays resident included), the share of the usable memory, and the
compile time. TPU presets need libtpu (pip install -e '.[tpu]'), NVIDIA ones JAX's CUDA plugin
(pip install -e '.[cuda]'); neither needs the accelerator. Exit status 1 if a preset does not fit.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from spiral_jax import aot
from spiral_jax.config import config_from_file
from spiral_jax.hardware import GiB, hardware
from spiral_jax.run.setup import run_spec


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# Each preset and the hardware it is written for.
PRESETS = {"kuhn_qwen3_4b_v4_8": "v4-8", "kuhn_qwen3_4b_v5e_8": "v5e-8", "kuhn_qwen3_4b_v5p_8": "v5p-8",
           "kuhn_qwen3_4b_v6e_8": "v6e-8", "mesh_tpu_v4_8": "v4-8", "kuhn_qwen3_4b_lora_v5e_8": "v5e-8",
           "kuhn_qwen3_4b_8xh100": "8xH100", "mesh_gpu_8x": "8xH100", "kuhn_qwen3_4b_1xh200": "1xH200",
           "kuhn_qwen3_1p7b_1xh100": "1xH100", "kuhn_qwen3_8b_lora_1xh100": "1xH100",
           "kuhn_qwen3_0p6b_1x4090": "1x4090", "kuhn_qwen3_4b_lora_1x4090": "1x4090"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", help="config names without .py (default: every preset)")
    parser.add_argument("--platform", choices=["tpu", "gpu"], help="only the presets for this platform")
    parser.add_argument("--attention", default="auto", help="model.attention for every preset (auto, xla, splash, cudnn)")
    parser.add_argument("--decode_attention", default="auto",
                        help="model.decode_attention for every preset (auto, pallas, xla)")
    parser.add_argument("--micro_batch", type=int, default=0, help="optim.micro_batch_size for every preset "
                        "(default: each preset's own)")
    args = parser.parse_args()
    names = args.presets or [n for n in PRESETS if args.platform in (None, hardware(PRESETS[n]).platform)]
    for name in names:
        aot.prepare(PRESETS[name])
    rows, all_fit = [], True
    for name in names:
        c = config_from_file(str(CONFIGS / f"{name}.py"))
        c.model.attention, c.model.decode_attention = args.attention, args.decode_attention
        if args.micro_batch:
            c.optim.micro_batch_size = args.micro_batch
        tgt = aot.target(PRESETS[name])
        start = time.perf_counter()
        results, plan = aot.compile_run(run_spec(c, planning=True), tgt, log=lambda m: print(f"  {name}: {m}", file=sys.stderr, flush=True))
        _, fits = aot.report(results, plan, tgt)
        worst = max(results, key=lambda r: r.total if r.total is not None else float("inf"))
        compiled = "OOM" if worst.total is None else f"{worst.total / GiB:.2f}"
        share = "" if worst.total is None else f" ({worst.total / tgt.memory:.0%})"
        rows.append(f"| `{name}.py` | {tgt.name} | {c.optim.micro_batch_size} | {plan.peak / GiB:.2f} | "
                    f"{compiled}{share} | {worst.name.split(' (')[0]} | {'yes' if fits else 'NO'} | "
                    f"{time.perf_counter() - start:.0f} s |")
        all_fit &= bool(fits)
        print(rows[-1], flush=True)
    print(f"\nattention: {args.attention}, decode attention: {args.decode_attention}\n")
    print("| preset | hardware | micro-batch | planner GiB | compiler GiB (of usable) | largest program | fits | "
          "compile time |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0 if all_fit else 1


if __name__ == "__main__":
    sys.exit(main())
