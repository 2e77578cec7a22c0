"""The memory planner: its estimate against what JAX measures on the 8 fake CPU devices, the presets
against their hardware, evaluation in chunks of games_per_batch, the suggestion for a setup that
does not fit, and the CLI."""
import dataclasses
import gc
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from spiral_jax import cli
from spiral_jax import hardware as H
from spiral_jax import plan as P
from spiral_jax.config import base_config, config_from_file
from spiral_jax.models import KVCache, cpu, init_params
from spiral_jax.models.transformer import CACHE_AXES
from spiral_jax.rl.reshard import make_reshard
from spiral_jax.rl.samples import TurnSample, pack, shard_batch
from spiral_jax.rl.train_step import init_train_state, make_train_step
from spiral_jax.run.setup import run_spec, train_config
from spiral_jax.sampling import Sampler, SamplingParams
from spiral_jax.sharding import MeshError, Rules, make_mesh


def planned(c):
    """The RunSpec the planner reads (`spiral-jax plan`'s)."""
    return run_spec(c, planning=True)


CONFIGS = Path(__file__).resolve().parents[1] / "configs"
PRESETS = {"kuhn_qwen3_4b_v4_8.py": "v4-8", "kuhn_qwen3_4b_v5e_8.py": "v5e-8", "kuhn_qwen3_4b_v5p_8.py": "v5p-8",
           "kuhn_qwen3_4b_v6e_8.py": "v6e-8", "kuhn_qwen3_4b_8xh100.py": "8xH100",
           "mesh_tpu_v4_8.py": "v4-8", "mesh_gpu_8x.py": "8xH100", "kuhn_qwen3_4b_1xh200.py": "1xH200",
           "kuhn_qwen3_1p7b_1xh100.py": "1xH100", "kuhn_qwen3_0p6b_1x4090.py": "1x4090",
           "kuhn_qwen3_4b_lora_1x4090.py": "1x4090", "kuhn_qwen3_4b_lora_v5e_8.py": "v5e-8",
           "kuhn_qwen3_8b_lora_1xh100.py": "1xH100"}
TOLERANCE = 0.2
PROMPT = NEW = 128  # training rows of 256 slots, a 256-slot KV cache
GAMES, MICRO = 16, 8


def tiny_config(dtype: str = "float32"):
    """A small Qwen3 (4 layers, hidden 128, vocab 4096) on a (2, 2, 2) mesh: every part of the plan is
    a few MiB, so fixed overheads do not dominate, and it compiles in seconds."""
    c = base_config()
    c.model.update(compute_dtype=dtype, scan_layers=True, remat=True)
    c.model.random.update(vocab_size=4096, hidden_size=128, intermediate_size=512, num_layers=4, num_heads=4,
                          num_kv_heads=2, head_dim=32)
    c.mesh.update(data=2, fsdp=2, tensor=2)
    c.rollout.update(max_prompt_len=PROMPT, max_new_tokens=NEW, games_per_batch=GAMES, samples_per_step=32)
    c.eval.update(games=0, final_games=0)
    c.optim.update(micro_batch_size=MICRO, logprob_chunk=64)
    return c


def on_device0(tree) -> int:
    d0 = jax.devices()[0]
    return sum(s.data.nbytes for a in jax.tree.leaves(tree) for s in a.addressable_shards if s.device == d0)


def live_on_device0() -> int:
    d0 = jax.devices()[0]
    return sum(s.data.nbytes for a in jax.live_arrays() for s in a.addressable_shards if s.device == d0)


# Parts the planner counts from shapes and dtypes, which must match the arrays to the byte; the rest
# (XLA's temporary buffers of compiled programs) within TOLERANCE.
EXACT = ("parameters", "optimizer state", "sampler params", "KV cache")
LIVE = "live arrays (params, Adam, sampler copy, KV cache)"  # plus the train state's scalar counters


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_estimate_matches_what_jax_measures_on_cpu(dtype):
    """fp32, and bf16 compute as the 4B/8B presets run it (fp32 master weights and Adam state, a
    bf16 sampler copy and KV cache)."""
    c = tiny_config(dtype)
    hw = H.custom_hardware(8, None)
    plan = P.plan(planned(c), hw)
    cfg, mesh, tc = plan.cfg, make_mesh(**c.mesh), train_config(c.optim)
    assert plan.parts["sampler_params"] > 0  # fsdp 2: the sampler gets its own copy

    # Live arrays: the train state, the sampler's copy and a rollout-sized KV cache, as the trainer holds them.
    gc.collect()  # arrays earlier tests left for the collector must not be freed mid-measurement
    before = live_on_device0()
    state = init_train_state(init_params(cfg, jax.random.key(0), mesh=mesh), cfg, tc, mesh)
    sample_params = make_reshard(cfg, mesh)(state.params)
    rules, slots = Rules.create(mesh, "sample"), PROMPT + NEW
    cache_sharding = rules.sharding(CACHE_AXES, (cfg.num_layers, GAMES, cfg.num_kv_heads, slots, cfg.head_dim))
    cache = jax.jit(lambda: KVCache.zeros(cfg, GAMES, slots), out_shardings=KVCache(cache_sharding, cache_sharding))()
    assert cache.k.dtype == dtype
    live = live_on_device0() - before

    # Compiled programs: the train step at two micro-batch sizes (the difference is activations
    # only) and the sampler's prefill + decode program.
    rng = np.random.default_rng(0)
    tokens = lambda n: rng.integers(0, cfg.vocab_size, n).tolist()  # noqa: E731
    samples = [TurnSample(tokens(PROMPT), tokens(NEW), [-1.0] * NEW, "g", 0, 0, 1.0) for _ in range(32)]

    def train_temp(micro):
        batch = shard_batch(pack(samples, row_multiple=micro), mesh)
        step = make_train_step(cfg, train_config(c.optim, micro_batch_size=micro), mesh)
        return step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes

    sampler = Sampler(cfg, mesh, max_prompt_len=PROMPT, max_cache_len=slots)
    program = sampler.lower(sample_params, [[1] * PROMPT] * GAMES, SamplingParams(NEW, temperature=1.0)).compile()

    temp, temp_double = train_temp(MICRO), train_temp(2 * MICRO)
    double = P.estimate(cfg, tc, dataclasses.replace(plan.work, micro_batch=2 * MICRO), plan.mesh, hw).parts
    p = plan.parts
    measured = {
        "parameters": on_device0(state.params),
        "optimizer state": on_device0(state.opt_state),
        "sampler params": on_device0(sample_params),
        "KV cache": on_device0(cache),
        "train-step temp (grads + gathered weights + activations)": temp,
        "activations of 8 more rows": temp_double - temp,
        "sampler temp (KV cache + prefill)": program.memory_analysis().temp_size_in_bytes,
    }
    estimated = {
        "parameters": p["params"],
        "optimizer state": p["optimizer"],
        "sampler params": p["sampler_params"],
        "KV cache": p["kv rollout"],
        "train-step temp (grads + gathered weights + activations)":
            p["gradients"] + p["weights_in_flight"] + p["activations"],
        "activations of 8 more rows": double["activations"] - p["activations"],
        # The sampler's program casts the weights to the compute dtype once, up front (weights_cast).
        "sampler temp (KV cache + prefill)": p["kv rollout"] + p["prefill rollout"] + p.get("weights_cast", 0),
    }
    resident = measured["parameters"] + measured["optimizer state"] + measured["sampler params"]
    measured[LIVE] = live
    estimated[LIVE] = (
        p["params"] + p["optimizer"] + p["sampler_params"] + p["kv rollout"])
    measured["total (peak phase)"] = resident + max(temp, measured["sampler temp (KV cache + prefill)"])
    estimated["total (peak phase)"] = plan.peak
    report = "\n".join(f"{k:<58} est {estimated[k] / 2**20:8.3f} MiB  measured {measured[k] / 2**20:8.3f} MiB"
                       f"  ratio {estimated[k] / measured[k]:.3f}" for k in measured)
    print("\n" + report)
    for k in measured:
        if k in EXACT:
            assert estimated[k] == measured[k], f"{k}: estimated {estimated[k]} bytes, measured {measured[k]}"
        elif k == LIVE:
            assert 0 <= measured[k] - estimated[k] <= 64, f"{k}: estimated {estimated[k]}, measured {measured[k]}"
        elif dtype == "float32" or k == "total (peak phase)":
            assert abs(estimated[k] / measured[k] - 1) <= TOLERANCE, report
        else:  # XLA:CPU computes bf16 in float32, so its temporaries are the float32 program's; the
            # planner counts bf16 activations (what TPUs and GPUs hold): between half of CPU's and it
            assert 0.5 <= estimated[k] / measured[k] <= 1 + TOLERANCE, report


@pytest.mark.parametrize("path, hardware", sorted(PRESETS.items()))
def test_presets_fit_their_hardware(path, hardware):
    plan = P.plan(planned(config_from_file(str(CONFIGS / path))), H.hardware(hardware))
    assert plan.fits, plan.table()
    assert plan.peak <= 0.9 * plan.hardware.memory * plan.hardware.usable
    assert plan.mesh.data * plan.mesh.fsdp * plan.mesh.tensor == H.hardware(hardware).devices


def test_a_setup_that_does_not_fit_warns_and_gets_a_suggestion_that_fits(capsys):
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))
    c.mesh.update(data=8, fsdp=1, tensor=1)  # every chip holds all of Qwen3-4B's weights and Adam state
    hw = H.hardware("v5e-8")
    bad = P.plan(planned(c), hw)
    assert bad.fits is False and bad.parts["params"] > 14 * P.GiB
    change, better = P.suggest(planned(c), hw, bad)
    assert better.fits and better.peak < bad.peak
    text, fits = P.report(planned(c), hw)
    assert fits is False and "WARNING" in text and change in text
    # The suggested overrides, applied through the CLI, give a plan that fits.
    args = ["spiral-jax", "plan", "--config", str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"), "--hardware", "v5e-8",
            "--config.mesh.data=8", "--config.mesh.fsdp=1", "--config.mesh.tensor=1"]
    assert cli.main(args) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert cli.main(args + change.split()) == 0
    assert ": fits" in capsys.readouterr().out


def test_evaluation_plays_at_most_games_per_batch_at_once():
    # Rollout.max_in_flight: an evaluation's sampler call is min(games, rollout.games_per_batch) games.
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_8xh100.py"))
    assert (c.eval.games, c.eval.final_games, c.rollout.games_per_batch) == (128, 512, 64)  # the paper's evals
    # The preset's decode engine plays max_in_flight games at once, and the plan says which key bounds it.
    engine = P.plan(planned(c), H.hardware("8xH100"))
    assert c.rollout.schedule == "continuous" and "(32 games at once)" in " ".join(engine.phases)
    assert any("play at most 32 games at once per host (rollout.max_in_flight)" in n for n in engine.notes)
    c.rollout.update(schedule="rounds", max_in_flight=0)  # sampler calls of games_per_batch games
    c.eval.max_new_tokens = 2048  # its own sampler call, apart from the rollout's
    hw = H.hardware("8xH100")
    plan = P.plan(planned(c), hw)
    assert "eval, final eval (64 games at once)" in plan.phases
    assert "64 games x 4096 slots" in plan.labels["kv eval, final eval"]
    assert any("eval (128 games) and final eval (512 games) play at most 64 games at once per host "
               "(rollout.games_per_batch)" in n for n in plan.notes)
    c.eval.final_games = 16  # fewer than games_per_batch: a smaller call of its own
    small = P.plan(planned(c), hw)
    assert small.parts["kv final eval"] < small.parts["kv eval"] == plan.parts["kv eval, final eval"]


def test_more_final_eval_games_than_games_per_batch_do_not_change_the_eval_sampler_memory():
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_8xh100.py"))
    c.eval.update(games=0, max_new_tokens=2048)  # only the final eval makes a 2048-token call
    hw = H.hardware("8xH100")
    plans = {}
    for games in (64, 66, 512, 4096):
        c.eval.final_games = games
        plans[games] = P.plan(planned(c), hw)
    for p in plans.values():
        assert p.parts["kv final eval"] == plans[64].parts["kv final eval"] > 0
        assert p.parts["prefill final eval"] == plans[64].parts["prefill final eval"]
        assert p.phases == plans[64].phases and p.peak == plans[64].peak and p.fits
    assert plans[4096].work.final_games == 4096  # the configured count is kept (and printed)


def test_suggestion_sizes_games_per_batch_for_evaluation_and_keeps_the_eval_games():
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))
    # Short rollouts, the paper's 4096-token evaluation in sampler calls: evaluation's chunks are what
    # does not fit.
    c.rollout.update(max_new_tokens=1024, games_per_batch=64, schedule="rounds", max_in_flight=0)
    hw = H.hardware("v5e-8")
    plan = P.plan(planned(c), hw)
    assert not plan.fits and plan.worst_phase == "eval, final eval (64 games at once)"
    change, better = P.suggest(planned(c), hw, plan)
    assert better.fits and "--config.rollout.games_per_batch=" in change and "--config.eval." not in change
    assert (better.work.eval_games, better.work.final_games) == (128, 512)
    g = better.work.rollout_games
    assert g < 64 and f"eval, final eval ({g} games at once)" in better.phases
    text, fits = P.report(planned(c), hw)
    assert fits is False and change in text and "cost time, not memory" in text


def test_cli_plan_prints_the_table(capsys):
    v5p = str(CONFIGS / "kuhn_qwen3_4b_v5p_8.py")
    assert cli.main(["spiral-jax", "plan", "--config", v5p, "--hardware", "v5p-8"]) == 0
    out = capsys.readouterr().out
    for text in ("parameters (fp32, train layout)", "optimizer state", "gradients", "activations", "KV cache",
                 "sampler's copy", "train step", "fits"):
        assert text in out
    # Explicit devices; and the local (CPU) devices, whose memory is unknown.
    assert cli.main(["spiral-jax", "plan", "--config", str(CONFIGS / "tiny_tictactoe.py"), "--devices", "8",
                     "--device_memory_gib", "16"]) == 0
    assert "8 devices x 16.0 GiB" in capsys.readouterr().out
    assert cli.main(["spiral-jax", "plan", "--config", str(CONFIGS / "tiny_tictactoe.py")]) == 0
    assert "no memory limit known" in capsys.readouterr().out
    # --compile compiles for a named slice or this machine; --devices is refused before any plan is printed.
    assert cli.main(["spiral-jax", "plan", "--config", str(CONFIGS / "tiny_tictactoe.py"), "--devices", "8",
                     "--compile"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "--compile needs --hardware (a TPU slice or an NVIDIA preset)" in err and "not --devices" in err


def test_cli_plan_unknown_hardware_lists_the_known_ones(capsys):
    tiny = str(CONFIGS / "tiny_tictactoe.py")
    assert cli.main(["spiral-jax", "plan", "--config", tiny, "--hardware", "v9-1024"]) == 1
    err = capsys.readouterr().err
    assert "unknown hardware 'v9-1024'" in err
    for name in H.HARDWARE:
        assert name in err


def test_hardware_presets_and_aliases():
    assert H.hardware("V5LITEPOD-8") == H.hardware("v5e-8")
    # TPU chips: the HBM the compiler makes available, not the chip's nominal size; GPUs as sold.
    assert [(h.devices, round(h.memory / P.GiB, 2)) for h in H.HARDWARE.values()] == [
        (4, 30.75), (8, 15.75), (4, 95.74), (8, 31.25), (8, 74.51), (1, 131.32), (1, 74.51), (1, 44.7), (1, 22.35)]
    assert H.hardware("H200") == H.hardware("1xh200") and H.hardware("a100") == H.hardware("1xH100")
    assert H.hardware("v5p-16").devices == 8 and H.hardware("v5litepod-16").memory == H.hardware("v5e-8").memory


@pytest.mark.parametrize("sizes", [(1, -1, 1), (2, -1, 2), (-1, 2, 2), (1, 1, 8), (2, 4, -1)])
def test_mesh_arithmetic_matches_make_mesh(sizes):
    assert P.MeshShape.resolve(*sizes, devices=8) == P.MeshShape(*make_mesh(*sizes).devices.shape)


@pytest.mark.parametrize("sizes", [(3, -1, 1), (-1, -1, 1), (2, 2, 4), (0, 1, 8)])
def test_mesh_arithmetic_rejects_what_make_mesh_rejects(sizes):
    with pytest.raises(MeshError):
        make_mesh(*sizes)
    with pytest.raises(MeshError):
        P.MeshShape.resolve(*sizes, devices=8)


def test_a_mesh_for_other_hardware_is_planned_anyway_with_a_suggestion(capsys):
    # mesh_gpu_8x.py's (1, 2, 4) mesh needs 8 devices; a v4-8 has 4 chips.
    assert cli.main(["spiral-jax", "plan", "--config", str(CONFIGS / "mesh_gpu_8x.py"), "--hardware", "v4-8"]) == 1
    out = capsys.readouterr().out
    assert "does not fit 4 devices" in out and "Suggestion" in out and "--config.mesh.tensor=" in out


def test_opponent_weights_are_counted():
    c = tiny_config()
    hw = H.custom_hardware(8, None)
    sample_copy = P.plan(planned(c), hw).parts["sampler_params"]
    c.rollout.update(mode="pool", pool_size=3)
    assert P.plan(planned(c), hw).parts["snapshots"] == 3 * sample_copy
    c.rollout.update(mode="fixed_opponent", opponent="/ckpt/frozen")
    assert P.plan(planned(c), hw).parts["snapshots"] == sample_copy
    c.rollout.opponent = "random"
    assert "snapshots" not in P.plan(planned(c), hw).parts


def test_the_kl_reference_is_counted():
    c = tiny_config()
    hw = H.custom_hardware(8, None)
    before = P.plan(planned(c), hw)
    assert "kl_reference" not in before.parts
    c.optim.kl_coef = 0.1
    after = P.plan(planned(c), hw)
    assert after.parts["kl_reference"] == after.parts["params"]
    assert after.phases["train step"] == before.phases["train step"] + after.parts["params"]


def test_remat_saves_and_unrolled_layers_on_a_gpu_are_counted():
    """What remat keeps adds its bytes to the activations, one micro-batch's tokens of it a layer. A
    GPU running the layers unrolled holds the gradient accumulator and a few layers' gradients, not a
    whole micro-batch's beside it; a scanned stack, or any layout elsewhere, holds both."""
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_1xh200.py"))
    c.model.update(remat_saves=(), scan_layers=True)
    hw = H.hardware("1xH200")
    base = P.plan(planned(c), hw)
    assert base.parts["gradients"] == 2 * base.parts["params"]
    cfg, work = base.cfg, base.work
    tokens = work.micro_batch * work.train_len
    for saves, width in ((("mlp",), 2 * cfg.intermediate_size),
                         (("qkv",), (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim)):
        c.model.remat_saves = saves
        kept = P.plan(planned(c), hw).parts["activations"] - base.parts["activations"]
        assert kept == cfg.num_layers * tokens * width * 2, saves  # bf16
    c.model.update(remat_saves=(), scan_layers=False)
    unrolled = P.plan(planned(c), hw).parts
    assert base.parts["params"] < unrolled["gradients"] < 1.2 * base.parts["params"]
    c.mesh.update(fsdp=-1)
    tpu = P.plan(planned(c), H.hardware("v5p-8")).parts
    assert tpu["gradients"] == 2 * tpu["params"]


def test_merged_lora_planned_for_a_gpu_counts_its_per_layer_copy():
    """Planned for a GPU (as `spiral-jax plan --compile` does), the merged copy is a per-layer list
    (`sample_config`); it is the same bytes as the stacked one planned elsewhere."""
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_8b_lora_1xh100.py"))
    c.model.attention = "xla"  # cuDNN's attention lowers only where cuDNN is installed
    spec = planned(c)
    with cpu.compiling_for("gpu"):  # first: the planner caches its byte counts
        gpu = P.plan(spec, H.hardware("1xH100"))
    assert gpu.parts["sampler_params"] == P.plan(spec, H.hardware("1xH100")).parts["sampler_params"] > 0


def test_lora_counts_frozen_weights_in_the_compute_dtype_and_optimizer_state_for_the_adapters_only():
    full = P.plan(planned(config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))), H.hardware("v5e-8"))
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))
    c.model.lora.update(rank=32, alpha=64.0)
    lora = P.plan(planned(c), H.hardware("v5e-8"))
    assert lora.parts["frozen"] == full.parts["params"] // 2  # bf16 against fp32, same layout
    assert lora.parts["params"] < 0.06 * full.parts["params"] and 0 <= lora.parts["optimizer"] - 2 * lora.parts["params"] < 1024
    assert lora.parts["sampler_params"] == lora.parts["frozen"]  # the merged copy
    c.model.lora.sample = "adapters"
    assert "sampler_params" not in P.plan(planned(c), H.hardware("v5e-8")).parts
    assert lora.phases["train step"] < full.phases["train step"] - 4 * P.GiB


def test_the_plan_says_when_a_gpu_sampler_would_copy_frozen_weights_out_of_a_stack():
    """Adapters applied in the forward over a stacked frozen model: on a GPU each decode step copies
    the frozen weights (docs/performance.md); the plan says so and names the setting that avoids it."""
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_lora_1x4090.py"))
    gpu, cpu = H.hardware("1x4090"), H.custom_hardware(1, None)
    copies = lambda c, hw: any("copy the frozen weights" in n for n in P.plan(planned(c), hw).notes)  # noqa: E731
    assert not copies(c, gpu)  # the preset holds them per layer
    c.model.scan_layers = True
    assert copies(c, gpu) and not copies(c, cpu)
    c.model.lora.sample = "merged"
    assert not copies(c, gpu)


def _documented_plans() -> list[tuple[list[str], str]]:
    """docs/memory.md's printed plans: (the command's arguments, its output as printed), from a code
    block that opens with `$ spiral-jax plan ...` or follows a line naming that command."""
    text = (CONFIGS.parent / "docs" / "memory.md").read_text()
    found = []
    for block in re.finditer(r"^```\w*\n(.*?)^```$", text, re.S | re.M):
        named = re.search(r"`(spiral-jax plan [^`]+)`:\n\n$", text[:block.start()])
        typed = re.match(r"\$ (spiral-jax plan [^\n]+)\n", block[1])
        command = typed[1] if typed else named[1] if named else None
        if command and "--compile" not in command:
            found.append((command.split(), block[1][typed.end():] if typed else block[1]))
    return found


# The Qwen3-4B presets tabulated in docs/memory.md, and the hardware each is planned for.
TABULATED = {"kuhn_qwen3_4b_v4_8": "v4-8", "kuhn_qwen3_4b_v5e_8": "v5e-8", "kuhn_qwen3_4b_v5p_8": "v5p-8",
             "kuhn_qwen3_4b_v6e_8": "v6e-8", "kuhn_qwen3_4b_8xh100": "8xH100", "mesh_tpu_v4_8": "v4-8",
             "mesh_gpu_8x": "8xH100"}


def test_the_plans_printed_in_docs_are_what_the_planner_prints_now(capsys, monkeypatch):
    """docs/memory.md shows `spiral-jax plan` for the single-card and LoRA presets, and tabulates every
    Qwen3-4B preset's peaks: both must be the planner's current output, not an older one's."""
    monkeypatch.chdir(CONFIGS.parent)
    plans = _documented_plans()
    assert len(plans) >= 4, plans
    for argv, printed in plans:
        assert cli.main(argv) == 0, argv
        assert capsys.readouterr().out == printed, f"docs/memory.md's output of {' '.join(argv)} is stale"
    table = (CONFIGS.parent / "docs" / "memory.md").read_text()
    rows = re.findall(r"^\| `(\w+)\.py` \| [^|]+ \| (\d+), (\d+), (\d+) \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| "
                      r"([\d.]+) of ([\d.]+) \((\d+)%\) \|$", table, re.M)
    assert sorted(name for name, *_ in rows) == sorted(TABULATED), rows
    for name, *numbers in rows:
        assert cli.main(["spiral-jax", "plan", "--config", f"configs/{name}.py", "--hardware", TABULATED[name]]) == 0
        out = capsys.readouterr().out
        mesh = re.search(r"mesh: data=(\d+) fsdp=(\d+) tensor=(\d+); micro-batch (\d+) row", out).groups()
        peak, usable, share = re.search(r"^peak: ([\d.]+) GiB per device \(.*?\) of ([\d.]+) GiB usable = (\d+)%",
                                        out, re.M).groups()
        now = [*mesh, re.search(r"rollout (?:a decode engine of )?(\d+) (?:games per call|slots)", out)[1],
               re.search(r"^  train step +([\d.]+)$", out, re.M)[1],
               re.search(r"^  rollout, eval, final eval \(\d+ games at once\) +([\d.]+)$", out, re.M)[1],
               peak, f"{float(usable):.1f}", share]
        assert numbers == now, f"docs/memory.md's row of {name}.py: {numbers}, the planner now: {now}"


def test_multihost_slices_keep_tensor_groups_on_one_host():
    """v5litepod-16 / v6e-16 are 4 hosts of 4 chips and each host samples on its own chips
    (`distributed.host_local_mesh`): tensor 8 would split a tensor group across hosts, so the planner
    refuses it and the search never suggests it."""
    hw = H.hardware("v5litepod-16")
    assert (hw.hosts, hw.devices_per_host) == (4, 4) and H.hardware("v6e-16").hosts == 4
    assert H.hardware("v5e-8").hosts == 1 and H.hardware("v5p-16").hosts == 2
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))
    c.mesh.update(data=1, fsdp=2, tensor=8)
    with pytest.raises(MeshError, match="tensor=8 splits tensor groups across the 4 hosts.*divides 4"):
        P.plan(planned(c), hw)
    assert {m.tensor for m in P.meshes(16, 4)} == {1, 2, 4}
    text, fits = P.report(planned(c), hw)
    assert fits is False and "splits tensor groups" in text
    change = text.split("Suggestion")[1].splitlines()[1].split()
    mesh = {k.rpartition(".")[2]: int(v) for k, v in (a.split("=") for a in change if "mesh" in a)}
    assert mesh["tensor"] <= 4
    c.mesh.update(**mesh)
    assert P.plan(planned(c), hw).mesh.tensor == mesh["tensor"]
    # docs/running.md's v5litepod-16 command
    c.mesh.update(data=1, fsdp=4, tensor=4)
    c.optim.micro_batch_size = 8
    assert P.plan(planned(c), hw).fits


def test_multihost_sampling_is_sized_on_one_hosts_chips():
    """Each host's sampler runs on a (1, chips per host / tensor, tensor) mesh: its decode engine of
    max_in_flight slots is the engine a one-host slice of those chips holds, not one split over every
    host's chips. In sampler calls, a host plays its share of the games."""
    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))
    c.mesh.update(data=1, fsdp=4, tensor=4)
    c.optim.micro_batch_size = 8
    hw = H.hardware("v5litepod-16")
    key = "kv rollout, eval, final eval"
    multi = P.plan(planned(c), hw)
    one_host = P.plan(planned(c), dataclasses.replace(hw, hosts=1))  # the whole mesh samples together
    c.mesh.update(fsdp=1)
    four_chips = P.plan(planned(c), H.hardware("v5litepod-4"))
    assert multi.parts[key] == four_chips.parts[key] == 4 * one_host.parts[key]
    assert multi.parts[f"prefill {key[3:]}"] == four_chips.parts[f"prefill {key[3:]}"]
    c.mesh.update(fsdp=4)
    c.rollout.update(schedule="rounds", max_in_flight=0, games_per_batch=16)
    rounds = P.plan(planned(c), hw)
    assert "rollout (4 games at once)" in rounds.phases  # 16 games over 4 hosts
    assert "eval, final eval (16 games at once)" in rounds.phases


def test_lora_adapters_on_fsdp_count_the_samplers_copy_of_the_frozen_weights():
    """model.lora.sample=adapters with fsdp > 1: the policy the sampler reads is the frozen weights and
    the adapters moved to the sample layout (`make_reshard`), a copy of both."""
    from spiral_jax.rl.reshard import make_policy, sample_config, split_frozen

    c = tiny_config("bfloat16")
    c.model.lora.update(rank=8, alpha=16.0, sample="adapters")
    c.mesh.update(data=1, fsdp=4, tensor=2)
    spec = planned(c)
    plan = P.plan(spec, H.custom_hardware(8, None))
    cfg, mesh = spec.model, make_mesh(**c.mesh)
    frozen, trained = split_frozen(cfg, init_params(cfg, jax.random.key(0), mesh=mesh), mesh)
    policy = make_reshard(sample_config(cfg, False), mesh)(make_policy(cfg, mesh, False)(trained, frozen))
    assert plan.parts["sampler_params"] == on_device0(policy) > on_device0(frozen)
    c.mesh.update(fsdp=1, tensor=8)  # one layout: the sampler reads the train state's arrays
    assert "sampler_params" not in P.plan(planned(c), H.custom_hardware(8, None)).parts


def test_continuous_schedule_counts_a_kv_cache_per_policy_and_max_in_flight_slots_for_evaluation():
    """Rollout._play_continuous makes a decode engine per LLM policy in the call (the model, each pool
    snapshot), each with its own cache; evaluation's engines have max_in_flight slots
    (`Rollout._engine`) however few games it plays, and "self" is a second policy."""
    from spiral_jax.rollout import Rollout

    c = config_from_file(str(CONFIGS / "kuhn_qwen3_4b_v5e_8.py"))
    hw = H.hardware("v5e-8")
    one = P.plan(planned(c), hw).parts["kv rollout, eval, final eval"]
    c.rollout.update(mode="pool", pool_size=4)
    pool = P.plan(planned(c), hw)
    assert pool.parts["kv rollout"] == 5 * one and pool.parts["kv eval, final eval"] == one
    assert "5 decode engines (one per policy) of 8 slots" in pool.labels["kv rollout"]
    c.rollout.mode = "self_play"
    c.eval.update(games=2, final_games=2, opponents=("random", "self"))
    small = P.plan(planned(c), hw)
    assert small.parts["kv eval, final eval"] == 2 * one and "eval, final eval (8 games at once)" in small.phases
    # the runtime's rule: an engine of max_in_flight slots for a 2-game evaluation
    b = base_config()
    b.model.random.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2,
                          num_kv_heads=1, head_dim=32)
    sampler = Sampler(planned(b).model, max_prompt_len=16, max_cache_len=80)
    fake = type("R", (), dict(max_in_flight=8, sampler=sampler, sampling=SamplingParams(64), engines={}))()
    assert Rollout._engine(fake, "model", 2).slots == 8


def test_devices_on_several_hosts_are_planned_as_a_multihost_slice(capsys):
    """--devices 16 --hosts 4 is four machines of 4 devices: a tensor group may not cross them, as on
    the Cloud TPU slice of that shape."""
    v4 = str(CONFIGS / "mesh_tpu_v4_8.py")  # tensor 4
    plan = ["spiral-jax", "plan", "--config", v4, "--devices", "16", "--config.mesh.fsdp=4"]
    assert cli.main(plan + ["--hosts", "4"]) == 0
    assert "16 devices on 4 hosts" in capsys.readouterr().out
    assert cli.main(plan + ["--hosts", "8", "--config.mesh.tensor=4"]) == 1
    assert "splits tensor groups across the 8 hosts" in capsys.readouterr().out
    assert H.planned_hardware("", 16, 40.0, 4).devices_per_host == 4


def test_unknown_memory_and_a_mesh_for_other_devices_names_a_mesh_that_matches(capsys):
    v4 = str(CONFIGS / "mesh_tpu_v4_8.py")  # data 1, fsdp 1, tensor 4: 4 devices
    assert cli.main(["spiral-jax", "plan", "--config", v4, "--devices", "8"]) == 1
    out = capsys.readouterr().out
    assert "No mesh" not in out and "Suggestion" in out
    change = out.split("Suggestion")[1].splitlines()[1].split()
    assert change == ["--config.mesh.data=1", "--config.mesh.fsdp=2", "--config.mesh.tensor=4"]
    assert cli.main(["spiral-jax", "plan", "--config", v4, "--devices", "8", *change]) == 0


def test_compiling_for_a_slice_without_a_chip_grid_says_why():
    from spiral_jax import aot

    with pytest.raises(ValueError, match="v5p-24: no chip grid known for 12 chips"):
        aot.tpu_devices("v5p-24")


def test_cli_plan_refuses_flags_it_would_ignore_or_that_make_no_sense(capsys):
    tiny = str(CONFIGS / "tiny_tictactoe.py")
    plan = ["spiral-jax", "plan", "--config", tiny]
    for flags, message in ((["--hardware", "v5e-8", "--device_memory_gib", "1"], "a --hardware preset has its own"),
                           (["--devices", "0"], "--devices must be >= 1"),
                           (["--devices", "8", "--device_memory_gib", "-1"], "--device_memory_gib must be > 0"),
                           (["--device_memory_gib", "0"], "--device_memory_gib must be > 0"),
                           (["--devices", "8", "--device_memory_gib", "nan"], "--device_memory_gib must be > 0 (GiB "
                                                                               "per device), got nan"),
                           (["--devices", "8", "--device_memory_gib", "inf"], "--device_memory_gib must be > 0"),
                           (["--hardware", "v5e-8", "--hosts", "2"], "--hosts is for --devices"),
                           (["--devices", "8", "--hosts", "3"], "a divisor of --devices")):
        assert cli.main(plan + flags) == 1, flags
        assert message in capsys.readouterr().err, flags
    assert H.hardware("8xh100 ") == H.hardware("8xH100") and H.hardware(" 1xH200") == H.hardware("1xH200")
