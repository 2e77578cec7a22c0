"""Where a `Sampler.generate` call spends its time on CPU, operation by operation.

Traces one call with XLA:CPU's per-operation trace events on, then sums the events per kind of
operation (the fusion's name without its number, and its output shape): those that run once per
decode step, and those that run once per call (prefill, the first token). Random weights, no
checkpoint needed. Operations that XLA runs concurrently (the two threads can run independent ones
side by side) each count their own duration, so the per-step sum can exceed the step's wall time.

    python bench/sampler_profile.py                         # tiny Qwen3, batch 32, 64 new tokens
    python bench/sampler_profile.py --model 0.6b --batch 8 --new 32
"""
import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile

DUMP = tempfile.mkdtemp(prefix="sampler_profile_")
# Per-operation trace events and the optimised HLO (for the shapes); set before jax is imported.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_enable_xprof_traceme=true"
                           f" --xla_dump_to={DUMP}/hlo --xla_dump_hlo_pass_re=^$").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from spiral_jax.models import ModelConfig, init_params  # noqa: E402
from spiral_jax.sampling import Sampler, SamplingParams  # noqa: E402

QWEN3 = dict(model_type="qwen3", tie_word_embeddings=True, remat=False)
MODELS = {
    "tiny": dict(vocab_size=32000, hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8,
                 num_kv_heads=2, head_dim=32),
    "0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                 num_kv_heads=8, head_dim=128),
}
PROMPT_LEN = 64


def trace_events(fn) -> list[dict]:
    """Complete ('X') trace events of one call of fn, from a Perfetto trace of it."""
    out = os.path.join(DUMP, "trace")
    with jax.profiler.trace(out, create_perfetto_trace=True):
        fn()
    path = glob.glob(os.path.join(out, "**", "*.trace.json.gz"), recursive=True)[0]
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def output_shapes() -> dict[str, str]:
    """HLO instruction name -> output shape, from the sampler program's optimised HLO."""
    paths = sorted(glob.glob(os.path.join(DUMP, "hlo", "*jit_program*after_optimizations.txt")))
    text = open(paths[-1]).read()
    # A tuple's shape has spaces, "(s32[], f32[8,64]{1,0})", and may hold tuples one level down; one
    # longer than a column (a while loop's whole state) is named by its number of arrays.
    def short(shape: str) -> str:
        shape = re.sub(r"/\*index=\d+\*/", "", shape)
        return shape if len(shape) <= 60 else f"a tuple of {shape.count('[')} arrays"

    return {name: short(shape) for name, shape in
            re.findall(r"^\s*%(\S+) = (\((?:[^()]|\([^()]*\))*\)|\S+) ", text, re.M)}


def report(events: list[dict], steps: int, top: int) -> None:
    shapes = output_shapes()
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e["name"] in shapes:  # an XLA operation (not a Python frame or a runtime event)
            total[e["name"]] += e["dur"]
            count[e["name"]] += 1
    for label, runs, per in (("per decode step", lambda n: count[n] % steps == 0, steps),
                             ("once per call (prefill, first token)", lambda n: count[n] == 1, 1)):
        kinds, num = collections.Counter(), collections.Counter()
        for name in filter(runs, total):
            op = re.sub(r"[._]fusion|[.]\d+$", "", name)  # ynn_fusion.7 -> ynn
            kind = f"{op:<32} {shapes[name]}"
            kinds[kind] += total[name] / per
            num[kind] += count[name] // per
        print(f"\n{label}: {sum(kinds.values()) / 1e3:.2f} ms in all")
        print(f"{'ms':>9} {'ops':>5}  operation, output shape")
        for kind, us in kinds.most_common(top):
            print(f"{us / 1e3:9.3f} {num[kind]:5d}  {kind}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="tiny")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new", type=int, default=64, help="new tokens per row")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    args = parser.parse_args()
    if args.new < 3:
        parser.error("--new must be at least 3, to tell per-step operations from once-per-call ones")
    cfg = ModelConfig(**QWEN3, **MODELS[args.model])
    params = init_params(cfg, jax.random.key(0))
    sampler = Sampler(cfg)
    rows = np.random.default_rng(0).integers(1, cfg.vocab_size, (args.batch, PROMPT_LEN)).tolist()
    sp = SamplingParams(max_new_tokens=args.new, temperature=1.0)
    for _ in range(4):  # compile; then let malloc settle: the first calls page their buffers in afresh
        sampler.generate(params, rows, sp)
    print(f"{args.model} Qwen3, batch {args.batch}, prompt {PROMPT_LEN}, {args.new} new tokens, "
          f"temperature 1, {len(os.sched_getaffinity(0))} CPUs")
    report(trace_events(lambda: sampler.generate(params, rows, sp, seed=1)), args.new - 1, args.top)


if __name__ == "__main__":
    main()
