"""Sampler throughput: spiral_jax vs transformers `generate`, side by side in one run.

Same random model, batch and lengths on both sides, 2 CPU threads each, prompt 64 tokens, sampling at
temperature 1 (no top-k / top-p, no stop token so every row generates the full budget). Then, per
batch, how each side's call splits into prefill and decode steps (a prefill is large matmuls on both
sides, where neither can be much faster than the machine's peak FLOP rate; the larger its share of a
call, the nearer the call's ratio is to the prefill's), and the batch-1 decode step time against the
memory floor (parameter bytes / read bandwidth measured here). XLA uses every core the process may
run on: on a bigger machine run it under `taskset -c 0,1`. The two sides take turns, repeat by
repeat, so that a slow spell of a shared machine hits both alike.

On a GPU (JAX's default backend is then the GPU) transformers runs on the GPU too, both sides in bf16
by default, and the batches grow: the question there is throughput at a trainer's batch sizes.

    python bench/sampler.py              # tiny Qwen3 at batch 1, 8, 32, 64 and the 0.6B shape at 1, 8
    python bench/sampler.py --only tiny  # just the tiny model
"""
import argparse
import copy
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from spiral_jax.models import load_pretrained
from spiral_jax.sampling import Sampler, SamplingParams
from timing import best_of_interleaved, timed  # bench/timing.py

torch.set_num_threads(2)
GPU = jax.default_backend() == "gpu"
TORCH_DEVICE = "cuda" if GPU else "cpu"

TINY = dict(vocab_size=32000, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
            num_attention_heads=8, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True)
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
PROMPT_LEN = 64


def read_bandwidth_gbs() -> float:
    """Read bandwidth of the machine: the best of plain reductions over 256 MiB (1 GiB on a GPU: past
    its caches). On CPU every core reads at once, as the decode step's two threads do: torch's
    multi-threaded sum, and numpy's in one thread per CPU. One numpy thread reads at about 2/3 of what
    two cores can (24 against 34-37 GB/s on this machine, measured), which would put the floor too high.
    """
    cpus = len(os.sched_getaffinity(0))
    with ThreadPoolExecutor(cpus) as pool:
        if GPU:
            x = jnp.ones(2**28, jnp.float32)
            total = jax.jit(jnp.sum)
            readers = [lambda: total(x).block_until_ready()]
        else:
            x = np.ones(256 * 2**20 // 4, np.float32)
            parts = np.array_split(x, cpus)
            readers = [torch.from_numpy(x).sum, lambda: list(pool.map(np.sum, parts))]
        for read in readers:
            read()  # warm up (compile, page in)
        return x.nbytes / min(timed(read) for read in readers for _ in range(5)) / 1e9


def build(shape: dict, path: str, dtype: str):
    config = transformers.Qwen3Config(**shape, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    model.save_pretrained(path)
    cfg, params = load_pretrained(path, dtype=jnp.dtype(dtype), compute_dtype=dtype)
    return model.to(TORCH_DEVICE), cfg, params


def hf_generate(model, prompts: np.ndarray, new: int):
    """transformers `generate` for `new` tokens, sampling at temperature 1, warmed up: a callable."""
    ids = torch.tensor(prompts, dtype=torch.long, device=TORCH_DEVICE)
    kwargs = dict(max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0, top_k=0,
                  top_p=1.0, pad_token_id=0, eos_token_id=None)

    def run(**overrides):
        with torch.no_grad():
            model.generate(ids, **{**kwargs, **overrides}).cpu()  # .cpu() waits for a GPU
    run(max_new_tokens=2, min_new_tokens=2)
    return run


def jax_generate(sampler, params, prompts: np.ndarray, new: int):
    """spiral_jax `Sampler.generate` for `new` tokens at temperature 1, compiled: a callable."""
    sp = SamplingParams(max_new_tokens=new, temperature=1.0)
    rows = prompts.tolist()
    sampler.generate(params, rows, sp, seed=0)  # compile
    return lambda: sampler.generate(params, rows, sp, seed=1)


def step_ms(seconds_new: float, seconds_one: float, new: int) -> float:
    """A decode step in ms, from a call's time for `new` tokens and for one: the prefill cancels."""
    return (seconds_new - seconds_one) / (new - 1) * 1e3


def print_split(parts, new: int) -> None:
    """Where each side's call goes: the prefill (a call for one new token: prefill and first sample)
    and the decode step ((call for `new` tokens - call for one) / (new - 1)). The ratio of whole calls
    lies between the two parts' ratios, nearer the prefill's the larger its share."""
    print(f"\n{'batch':>6} {'prefill ms: ours':>17} {'ref':>8} {'ratio':>6}   "
          f"{'decode ms/step: ours':>20} {'ref':>8} {'ratio':>6}   prefill share of our call")
    for batch, best in parts:
        pre = {k: best[k + "_1"] * 1e3 for k in ("ours", "ref")}
        step = {k: step_ms(best[k], best[k + "_1"], new) for k in ("ours", "ref")}
        print(f"{batch:>6} {pre['ours']:>17.1f} {pre['ref']:>8.1f} {pre['ref'] / pre['ours']:>5.2f}x   "
              f"{step['ours']:>20.2f} {step['ref']:>8.2f} {step['ref'] / step['ours']:>5.2f}x   "
              f"{best['ours_1'] / best['ours']:.0%}")


def decode_ms_per_step(sampler, params, new: int) -> float:
    """(time for `new` tokens - time for 1 token) / (new - 1) at batch 1: the pure decode step."""
    rows = [list(range(1, PROMPT_LEN + 1))]
    times = {}
    for n in (1, new):
        sp = SamplingParams(max_new_tokens=n, temperature=1.0)
        sampler.generate(params, rows, sp)
        times[n] = min(timed(lambda: sampler.generate(params, rows, sp)) for _ in range(5))
    return step_ms(times[new], times[1], new)


def run(name: str, shape: dict, batches, new: int, repeats: int, dtype: str, bf16: bool):
    """One model: tok/s of both sides per batch. `bf16`: also against transformers in bf16."""
    with tempfile.TemporaryDirectory() as tmp:
        model, cfg, params = build(shape, tmp, dtype)
    sampler = Sampler(cfg)
    rng = np.random.default_rng(0)
    ref_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model.to(ref_dtype)
    ref_name = "transformers " + ("f32" if dtype == "float32" else "bf16")
    print(f"\n{name}: {cfg.num_params / 1e6:.1f}M params, {dtype}, prompt {PROMPT_LEN}, {new} new "
          f"tokens, temperature 1, {jax.devices()[0].device_kind}")
    header = f"{'batch':>6} {'spiral_jax tok/s':>17} {ref_name:>18} {'ratio':>7}"
    bf16 = bf16 and dtype != "bfloat16"
    print(header + (f" {'transformers bf16':>18} {'ratio':>7}" if bf16 else ""))
    model16 = copy.deepcopy(model).to(torch.bfloat16) if bf16 else None
    parts = []  # per batch: seconds of both sides for one new token and for `new`
    for batch in batches:
        prompts = rng.integers(1, cfg.vocab_size, (batch, PROMPT_LEN))
        runs = {"ours": jax_generate(sampler, params, prompts, new), "ref": hf_generate(model, prompts, new),
                "ours_1": jax_generate(sampler, params, prompts, 1), "ref_1": hf_generate(model, prompts, 1)}
        if bf16:  # in the same rounds as the others, so that it gets the same best-of
            runs["ref16"] = hf_generate(model16, prompts, new)
        best = best_of_interleaved(runs, repeats)
        parts.append((batch, best))
        ours, ref = (batch * new / best[k] for k in ("ours", "ref"))
        line = f"{batch:>6} {ours:>17.1f} {ref:>18.1f} {ours / ref:>6.2f}x"
        if bf16:
            ref16 = batch * new / best["ref16"]
            line += f" {ref16:>18.1f} {ours / ref16:>6.2f}x"
        print(line, flush=True)
    print_split(parts, new)
    # A shared machine's bandwidth drifts: measured right before and after, and the higher one (the
    # lower floor) is kept.
    before = read_bandwidth_gbs()
    step = decode_ms_per_step(sampler, params, new)
    bandwidth = max(before, read_bandwidth_gbs())
    weight_bytes = cfg.num_params * jnp.dtype(dtype).itemsize
    floor = weight_bytes / (bandwidth * 1e9) * 1e3
    print(f"decode step at batch 1: {step:.2f} ms; memory floor {floor:.2f} ms "
          f"({weight_bytes / 1e6:.0f} MB of {dtype} params at {bandwidth:.1f} GB/s); "
          f"{step / floor:.2f}x the floor (the step reads the weights at "
          f"{weight_bytes / step / 1e6:.1f} GB/s)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["tiny", "0.6b"], default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16" if GPU else "float32",
                        help="compute dtype of both sides (default: bf16 on a GPU, fp32 on a CPU)")
    args = parser.parse_args()
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__} on "
          f"{TORCH_DEVICE}, transformers {transformers.__version__}, {len(os.sched_getaffinity(0))} CPUs "
          f"for XLA, {torch.get_num_threads()} threads for torch")
    tiny_batches, big_batches = ([1, 8, 64, 256], [1, 8, 64]) if GPU else ([1, 8, 32, 64], [1, 8])
    if args.only in (None, "tiny"):
        run("tiny Qwen3", TINY, tiny_batches, 64, args.repeats, args.dtype, bf16=False)
    if args.only in (None, "0.6b"):
        run("Qwen3-0.6B shape", QWEN3_06B, big_batches, 32, max(1, args.repeats - 1), args.dtype,
            bf16=not GPU)


if __name__ == "__main__":
    main()
