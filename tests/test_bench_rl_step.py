"""bench/rl_step.py at its tiny shape on CPU: the whole RL step runs, its breakdown adds up to the step,
and the last line has the promised format with positive, finite figures. Also the stand-in stopping
rule it relies on: the stop token drawn with the stated probability whatever the weights."""
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from spiral_jax.models import init_params
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sampling.engine import DecodeEngine, Request
from spiral_jax.sampling.engine_programs import engine_programs
from tests.scripts import load_script
from tests.tiny_models import TINY

BENCH = Path(__file__).resolve().parents[1] / "bench" / "rl_step.py"
LAST_LINE = re.compile(r"rl step (\d+\.\d) s, decode (\d+\.\d\d)x HBM floor, train MFU (\d+)%, "
                       r"GPU-seconds per step (\d+)")
PHASES = ("prefill", "decode", "host and games", "old log-probs", "train", "hand-over, packing, metrics")


def _bench_module(name: str = "rl_step"):
    """bench/rl_step.py, or one of the modules it is made of (step_probes, step_costs, device)."""
    return load_script(f"bench/{name}.py")


def _run_tiny_bench(*flags: str) -> subprocess.CompletedProcess:
    """bench/rl_step.py at the tiny shape in a subprocess on one CPU device, as a user's run has (the
    tests' 8 fake devices would shard the step 8 ways); fails the test if it fails."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
    result = subprocess.run([sys.executable, str(BENCH), "--shape", "tiny", *flags], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_tiny_step_prints_its_breakdown_and_the_summary_line():
    # A second step would pass the time limit, so the bench stops after the first and reports it.
    # Compiling ahead (off on a CPU by default) runs as it would on a GPU: its compiles are reported
    # apart, and none of them is taken out of the phases below.
    result = _run_tiny_bench("--steps", "2", "--time_limit", "1", "--compile_ahead", "2")
    lines = result.stdout.strip().splitlines()
    assert "2 threads compile the next programs ahead" in result.stdout, result.stdout
    assert re.search(r"^step 1 of 2: .*; \d+ of the programs compiled ahead on background threads", result.stdout,
                     re.M), result.stdout
    assert re.search(r"^stopping after step 1: another \(about \d+ s\) would end past --time_limit 1 s$",
                     result.stdout, re.M), result.stdout
    assert "step 2 of 2" not in result.stdout
    # Lines as the step goes, stamped with the seconds since the start, so that a run cut short still
    # says how far it got: each sampler call, the rollout's end, PPO's old log-probs, the epochs.
    went = re.findall(r"^  \[ *(\d+) s\] (sampler call \d+|rollout|old log-probs|train): ", result.stdout, re.M)
    calls = [name for _, name in went[:-3]]
    assert [name for _, name in went[-3:]] == ["rollout", "old log-probs", "train"], result.stdout
    assert calls and calls == [f"sampler call {i}" for i in range(1, len(calls) + 1)], result.stdout
    stamps = [int(t) for t, _ in went]
    assert stamps == sorted(stamps) and result.stdout.index(went[-1][1] + ": ") < result.stdout.index("step 1 of 2")
    # The rollout's first call (8 games) compiled the 2-row program ahead: the report times it too.
    two = re.search(r"^decode step at batch 2: (\d+\.\d\d) ms, HBM floor (\d+\.\d\d) ms: (\d+\.\d\d)x; "
                    r"(\d+\.\d\d)x the batch-1 step$", result.stdout, re.M)
    assert two and all(float(x) > 0 for x in two.groups()), result.stdout
    match = LAST_LINE.fullmatch(lines[-1])
    assert match, lines[-1]
    step, decode, mfu, device_seconds = (float(x) for x in match.groups())
    assert step > 0 and decode > 0 and 0 < mfu <= 100 and abs(device_seconds - step) <= 0.55, lines[-1]
    parts = {m[1]: float(m[2]) for m in re.finditer(r"^  (\S.*?) +(-?\d+\.\d+) s +-?[\d.]+%$", result.stdout, re.M)}
    assert set(parts) == set(PHASES), result.stdout
    total = float(re.search(r"^  step +(\d+\.\d+) s$", result.stdout, re.M)[1])
    # Six parts printed to 0.01 s each add up to the printed step, which the last line rounds to 0.1 s.
    assert abs(sum(parts.values()) - total) <= 0.035 and np.isclose(total, step, atol=0.051), result.stdout
    assert all(v >= 0 for k, v in parts.items() if k != "hand-over, packing, metrics"), parts


def test_rollout_only_counts_what_decoding_reads_and_its_floor_at_another_shape():
    """--rollout_only plays one rollout and prices its reads at Qwen3-4B's sizes: the floor printed is
    the steps' weights plus the cache's slot-tokens over the bandwidth given."""
    # Answers up to 512 tokens, long enough beside the prompts to share rows; a mean of 64 (not the default
    # 128, a quarter of the cap) still gives the long answers that set the rows' length, and halves the
    # decoding the test sits through (it prices the reads, whatever their count).
    result = _run_tiny_bench("--rollout_only", "4b", "--bandwidth_tbs", "4.8", "--micro_batch", "2",
                             "--max_new_tokens", "512", "--mean_tokens", "64")
    assert "step 1 of" not in result.stdout and "rl step" not in result.stdout, result.stdout  # no training
    # The rollout's time less its program making, and that making, counted apart: both positive.
    played = re.search(r"^rollout \(rounds, \d+ calls\): \d+ games, \d+ moves, [\d,]+ tokens in (-?\d+\.\d) s "
                       r"\(and (-?\d+\.\d) s making programs\)$", result.stdout, re.M)
    assert played and float(played[1]) > 0 and float(played[2]) > 0, result.stdout
    line = re.search(r"^decode reads: ([\d,]+) steps of ([\d.]+) rows on average, ([\d,]+) slot-tokens of cache; "
                     r"floor at 4b's bf16 sizes \(8.04 GB of weights, 147 KB of cache a token\) and 4.8 TB/s: "
                     r"([\d.]+) s, of which weights ([\d.]+) s; ([\d.]+) s per 1k tokens$", result.stdout, re.M)
    assert line, result.stdout
    steps, rows, slot_tokens = (float(x.replace(",", "")) for x in line.groups()[:3])
    floor, weights = float(line[4]), float(line[5])
    four_b = _bench_module().ModelConfig(**_bench_module().QWEN3["4b"])
    assert steps > 0 and rows >= 1 and slot_tokens >= steps * rows, line[0]
    assert np.isclose(weights, steps * four_b.num_params * 2 / 4.8e12, atol=0.051), line[0]
    assert np.isclose(floor, weights + slot_tokens * 147456 / 4.8e12, atol=0.11), line[0]
    # XLA's attention reads every row's whole window: at least the filled cache, priced the same way.
    windows = re.search(r"^read as XLA's attention reads it \(every row of a call its whole window, ([\d,]+) "
                        r"slot-tokens\): ([\d.]+) s, ([\d.]+) s per 1k tokens$", result.stdout, re.M)
    assert windows, result.stdout
    window_tokens = float(windows[1].replace(",", ""))
    assert window_tokens >= slot_tokens, (windows[0], line[0])
    assert np.isclose(float(windows[2]), weights + window_tokens * 147456 / 4.8e12, atol=0.11), windows[0]
    # The trainer's packing (on CPU up to 16 samples a row) beside one sample a row: the same tokens.
    layouts = re.findall(r"^train batch, at most (\d+) samples? a row: (\d+) samples in (\d+) rows of ([\d,]+) "
                         r"slots, ([\d,]+) tokens in them: (\d+)% of the slots", result.stdout, re.M)
    assert [int(x[0]) for x in layouts] == [16, 1], result.stdout
    (_, n, rows, slots, tokens, share), (_, _, rows1, slots1, tokens1, share1) = (
        [int(x.replace(",", "")) for x in layout] for layout in layouts)
    assert rows1 == n == 16 and tokens1 == tokens and slots1 == slots, layouts
    assert 0 < tokens <= rows * slots and share == round(100 * tokens / (rows * slots)), layouts
    assert rows < rows1 and share > share1, layouts


@pytest.mark.slow
def test_tiny_continuous_step_measures_its_engines_decode_calls():
    result = _run_tiny_bench("--steps", "1", "--schedule", "continuous", "--max_in_flight", "4")
    line = re.search(r"^decode step at the rollout's batch \((\d+) live rows of 4 slots at a call's start on average, "
                     r"(\d+) steps\): (\d+\.\d\d) ms, HBM floor (\d+\.\d\d) ms: (\d+\.\d\d)x; (\d+\.\d\d)x the "
                     r"(\d+\.\d\d) ms of its windows' reads \(every row its whole attention window\)$", result.stdout, re.M)
    assert line, result.stdout
    rows, steps, ms, floor, ratio, _, windowed = (float(x) for x in line.groups())
    assert windowed >= floor, line[0]  # every slot's window, against the live rows' filled cache
    assert 1 <= rows <= 4 and steps > 0 and ms > 0 and floor > 0, line[0]
    # The ratio of the unrounded times: within the two-decimal rounding of the printed ones.
    assert abs(ratio - ms / floor) <= ms / floor * (0.005 / ms + 0.005 / floor) + 0.005, line[0]
    assert LAST_LINE.fullmatch(result.stdout.strip().splitlines()[-1]), result.stdout


def test_a_sampler_calls_window_reads_follow_its_decode_stages():
    """Each decode step reads every row's whole window of the stage it runs in: step s (tokens so far)
    in the first stage whose window holds slot prompt_bucket + s."""
    window_read = _bench_module("step_costs").window_read
    windows = [512, 1280, 4352]  # `attention_windows(256, 4352)`
    assert window_read(2, 256, windows, 1500) == 2 * (256 * 512 + 768 * 1280 + 476 * 4352)
    assert window_read(3, 256, windows, 100) == 3 * 100 * 512
    assert window_read(1, 256, windows, 256) == 256 * 512 and window_read(1, 256, windows, 257) == 256 * 512 + 1280
    assert window_read(4, 256, windows, 0) == 0


def test_the_stop_token_is_drawn_with_the_stated_probability():
    bench = _bench_module()
    params = init_params(TINY, jax.random.key(0))
    stop = TINY.vocab_size - 1
    sp = SamplingParams(max_new_tokens=64, temperature=1.0, stop_token_ids=frozenset({stop}))
    prompts = [[1 + i % 50, 2, 3] for i in range(512)]
    with bench.stop_probability(stop, mean_tokens=8):
        biased = Sampler(TINY, max_prompt_len=16, max_cache_len=16 + 64)  # compiles its program in here
        lengths = np.array([len(t) for t in biased.generate(params, prompts, sp, seed=0).tokens])
        # The decode engine's programs too (the continuous schedule's), for 128 of the prompts.
        engine, queue, engine_lengths = DecodeEngine(biased, sp, 32), [Request(p, 0, i) for i, p in
                                                                      enumerate(prompts[:128])], []
        while queue or engine.live:
            free = len(engine.free_slots())
            engine.insert(params, queue[:free])
            queue = queue[free:]
            engine_lengths += [len(f.tokens) for f in engine.decode(params)]
    engine_programs.cache_clear()  # the engine's programs, shared by shape, keep the bias
    expected, capped = bench.geometric_lengths(8, 64)
    assert abs(lengths.mean() / expected - 1) < 0.1, (lengths.mean(), expected)
    assert len(engine_lengths) == 128 and abs(np.mean(engine_lengths) / expected - 1) < 0.3, np.mean(engine_lengths)
    assert capped < 1e-3 and lengths.max() < 64
    # Without it the random model almost never draws the one stop token among 64.
    sampler = Sampler(TINY, max_prompt_len=16, max_cache_len=16 + 64)
    plain = np.array([len(t) for t in sampler.generate(params, prompts, sp, seed=0).tokens])
    assert plain.mean() > 3 * expected


def test_a_step_fits_the_time_limit_by_its_time_less_compiling():
    fits = _bench_module().fits
    assert fits(500, 1000, None)
    assert fits(300, 80, 400) and fits(320, 80, 400)
    assert not fits(321, 80, 400)


def test_busy_time_is_the_union_of_the_kernels_intervals():
    """The GPU-busy time of a decode step's trace counts overlapping kernels (several streams) once."""
    busy_time = _bench_module("device").busy_time
    assert busy_time([]) == 0
    assert busy_time([("a", 0, 10), ("b", 20, 5)]) == 15
    assert busy_time([("a", 0, 10), ("b", 5, 10), ("c", 30, 1), ("d", 2, 3)]) == 16


def test_program_making_counts_tracing_once():
    """The seconds left out of every phase include tracing (an engine's inserts meet new shapes within a
    step), never more than the call took; events that overlap (one made while another is) count once."""
    bench = _bench_module("step_probes")
    made = bench.CompileSeconds()

    def slow_to_trace(x):
        time.sleep(0.3)  # runs while tracing only
        return x + 1

    program = jax.jit(slow_to_trace)
    before, start = made.total, time.perf_counter()
    assert float(program(np.float32(1))) == 2
    took, counted = time.perf_counter() - start, made.total - before
    assert 0.3 <= counted <= took, (counted, took)
    before = made.total
    program(np.float32(2))  # compiled already: nothing made
    assert made.total == before
    time.sleep(0.6)  # past everything made so far
    made._on_event(bench.CompileSeconds.EVENTS[2], 0.2)  # inside the next one, which ends after it
    made._on_event(bench.CompileSeconds.EVENTS[0], 0.5)
    made._on_event("/jax/some/other_duration", 9.0)
    assert abs(made.total - before - 0.5) < 0.01
    # A compile on a background thread (compiling ahead) overlaps the main thread's work: counted apart.
    # The main thread's wait for one is program making.
    before = made.total
    worker = threading.Thread(target=made._on_event, args=(bench.CompileSeconds.EVENTS[2], 3.0))
    worker.start(), worker.join()
    assert made.total == before and made.ahead[-1] == 3.0
    time.sleep(0.3)
    made._on_event(bench.WAIT_EVENT, 0.25)
    assert abs(made.total - before - 0.25) < 0.01


def test_the_kernel_line_says_where_a_decode_step_goes(monkeypatch, capsys):
    """From traces of n = 1 and n = 5 decoded tokens: the kernels and busy time a step (the difference,
    over 4 steps) against the step's time, and the kernels that take the most time a step."""
    bench = _bench_module("device")
    us = 1000  # ns
    prefill = [("prefill", 0, 400 * us)]
    steps = [(name, 1000 * us * (i + 1) + offset * us, 300 * us) for i in range(4)
             for name, offset in (("gemv", 0), ("softmax", 500))]
    traces = {1: prefill, 5: prefill + steps}
    monkeypatch.setattr(bench, "gpu_kernels", lambda fn: (fn(), ""))
    bench.print_kernels(lambda n: traces[n], 5, step_s=1e-3)
    line = capsys.readouterr().out.strip()
    assert line == ("on the GPU: 2 kernels a step, busy 0.60 ms of the 1.00 ms step (60%); the most time a "
                    "step: gemv 300 us, softmax 300 us, prefill 100 us"), line


def test_the_training_pass_line_says_where_its_time_goes(monkeypatch, capsys):
    """From a trace of a training pass: kernels busy against the pass's time, busy time by kind of
    kernel (named as XLA's Triton products, cuBLAS and cuDNN's attention name theirs), and the
    matmuls' rate at the weights' product FLOPs."""
    bench = _bench_module("device")
    ms = 1_000_000  # ns
    trace = [("gemm_fusion_dot_12", 0, 300 * ms), ("sm90_xmma_gemm_bf16", 300 * ms, 100 * ms),
             ("cudnn_generated_fort_native_sdpa_sm90", 400 * ms, 200 * ms), ("loop_add_fusion_3", 650 * ms, 50 * ms)]
    monkeypatch.setattr(bench, "gpu_kernels", lambda fn: (trace, ""))
    bench.print_pass_kernels("a pass", lambda: None, seconds=1.0, product_flops=400e12)
    line = capsys.readouterr().out.strip()
    assert line == ("on the GPU, a pass: 4 kernels busy 0.65 s of 1.00 s (65%); matmul 0.40 s, attention "
                    "0.20 s, other 0.05 s; the matmuls at 1000 TFLOP/s; the most time: gemm_fusion_dot_12 "
                    "0.30 s, cudnn_generated_fort_native_sdpa_sm90 0.20 s, sm90_xmma_gemm_bf16 0.10 s, "
                    "loop_add_fusion_3 0.05 s"), line
    monkeypatch.setattr(bench, "gpu_kernels", lambda fn: ([], "no device trace (a CPU)"))
    bench.print_pass_kernels("a pass", lambda: None, seconds=1.0, product_flops=1.0)
    assert capsys.readouterr().out.strip() == "kernels of a pass: no device trace (a CPU)"
