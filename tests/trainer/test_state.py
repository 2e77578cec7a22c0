"""RunState: a run's whole state as one value, through a checkpoint and back; RunSpec's checks."""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.checkpoint import Checkpointer
from spiral_jax.models import CheckpointError
from spiral_jax.config import base_config
from spiral_jax.rl.train_step import TrainConfig, init_train_state
from spiral_jax.run import RunState, run_spec


def _state(tiny_model, scale: float) -> RunState:
    cfg, params, _ = tiny_model
    params = jax.tree.map(lambda x: x * scale, params)
    train = init_train_state(params, cfg, TrainConfig(learning_rate=1e-3))
    train = train._replace(step=jnp.asarray(7, jnp.int32), skipped=jnp.asarray(2, jnp.int32))
    snapshot = jax.tree.map(lambda x: x + 1.0, params)
    return RunState(train, step=7, rae={"baselines": {"TicTacToe-v0": {"0": 0.25, "1": -0.5}}},
                    pool=[snapshot], pool_steps=[5], reference=jax.tree.map(lambda x: x - 1.0, params),
                    totals={"games": 12, "sampled_tokens": 345, "trained_tokens": 678}, lora_base="random:abc")


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def _assert_equal(a: RunState, b: RunState):
    for field in dataclasses.fields(RunState):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if field.name in ("train", "pool", "reference"):
            assert len(_leaves(x)) == len(_leaves(y)), field.name
            for u, v in zip(_leaves(x), _leaves(y)):
                np.testing.assert_array_equal(u, v, err_msg=field.name)
        else:
            assert x == y, field.name


def test_a_run_state_round_trips_through_a_checkpoint(tmp_path, tiny_model):
    saved = _state(tiny_model, 2.0)
    ckpt = Checkpointer(tmp_path / "checkpoints", async_save=False)
    saved.save(ckpt, seed=3, config_json="{}")
    like = _state(tiny_model, 1.0)  # another state of the same shapes
    restored = RunState.restore(ckpt, like, like.pool[0], log=lambda *_: None)
    _assert_equal(dataclasses.replace(saved, config="{}"), restored)  # the config it was written with
    without = RunState.restore(ckpt, like, like.pool[0], log=lambda *_: None, reference=False)
    assert without.reference is None and without.step == 7
    ckpt.close()
    reader = Checkpointer(tmp_path / "checkpoints")  # what eval and export read: the parameters alone
    params, step, _ = reader.restore_params(_abstract(like.train.params), step=7)
    assert step == 7 and all(np.array_equal(a, b) for a, b in zip(_leaves(params), _leaves(saved.train.params)))
    reader.close()


def test_a_restore_reads_only_the_newest_pool_snapshots_it_keeps(tmp_path, tiny_model):
    """A run resumed with a smaller rollout.pool_size, or outside pool mode, restores just the newest
    snapshots it keeps (none outside pool mode), with their steps; the others are never read."""
    saved = _state(tiny_model, 2.0)
    snapshots = [jax.tree.map(lambda x, k=k: x + k, saved.pool[0]) for k in range(3)]
    saved = dataclasses.replace(saved, pool=snapshots, pool_steps=[3, 4, 5])
    ckpt = Checkpointer(tmp_path / "checkpoints", async_save=False)
    saved.save(ckpt, seed=3, config_json="{}")
    like = _state(tiny_model, 1.0)
    for keep, steps in ((None, [3, 4, 5]), (5, [3, 4, 5]), (2, [4, 5]), (1, [5]), (0, [])):
        restored = RunState.restore(ckpt, like, like.pool[0], log=lambda *_: None, pool_keep=keep)
        assert restored.pool_steps == steps and len(restored.pool) == len(steps), keep
        for got, want in zip(restored.pool, snapshots[3 - len(steps):]):
            assert all(np.array_equal(a, b) for a, b in zip(_leaves(got), _leaves(want))), keep
        _assert_equal(dataclasses.replace(saved, pool=restored.pool, pool_steps=steps, config="{}"), restored)
    ckpt.close()


def test_a_pool_saved_as_a_standard_item_restores(tmp_path, tiny_model, monkeypatch):
    """Checkpoints whose pool was written with orbax's StandardSave read back as the PyTree they are."""
    import orbax.checkpoint as ocp

    saved = _state(tiny_model, 2.0)
    saved = dataclasses.replace(saved, pool=[saved.pool[0], jax.tree.map(lambda x: x * 3, saved.pool[0])],
                                pool_steps=[4, 5])
    with monkeypatch.context() as m:
        m.setattr(ocp.args, "PyTreeSave", ocp.args.StandardSave)
        ckpt = Checkpointer(tmp_path / "checkpoints", async_save=False)
        saved.save(ckpt, seed=3, config_json="{}")
        ckpt.close()
    like = _state(tiny_model, 1.0)
    for keep in (None, 1):
        restored = RunState.restore(Checkpointer(tmp_path / "checkpoints"), like, like.pool[0],
                                    log=lambda *_: None, pool_keep=keep)
        n = 2 if keep is None else 1
        _assert_equal(dataclasses.replace(saved, pool=saved.pool[-n:], pool_steps=[4, 5][-n:], config="{}"), restored)


def _damage(folder):
    for data in [p for p in (folder / "state").rglob("*") if p.is_file()]:  # every file cut short
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 2)


def test_a_damaged_step_is_set_aside_again_and_named_when_asked_for(tmp_path, tiny_model):
    """A step set aside, written again by the resumed run and damaged again, is set aside under a
    new name; a reader (eval, export, serve: the run may still be training) leaves it where it is,
    and asked for by number (eval --step), a damaged step is a one-line error."""
    saved, like = _state(tiny_model, 2.0), _state(tiny_model, 1.0)
    folder = tmp_path / "checkpoints"
    ckpt = Checkpointer(folder, async_save=False)
    lines = []
    saved.save(ckpt, seed=3, config_json="{}")
    _damage(folder / "7")
    with pytest.raises(CheckpointError, match="no checkpoint in .* can be read: step 7"):
        ckpt.restore_params(_abstract(like.train.params), log=lines.append)
    assert "set aside" not in lines[-1] and lines[-1].endswith("no older one to try")
    assert (folder / "7").is_dir() and not list(folder.glob("*.unreadable"))
    ckpt._manager.delete(7)
    for name in ("7.unreadable", "7.unreadable-2"):
        saved.save(ckpt, seed=3, config_json="{}")
        _damage(folder / "7")
        with pytest.raises(CheckpointError, match="no checkpoint in .* can be read: step 7"):
            RunState.restore(ckpt, like, like.pool[0], log=lines.append)
        assert f"set aside as {name};" in lines[-1] and (folder / name).is_dir() and not (folder / "7").exists()
    saved.save(ckpt, seed=3, config_json="{}")
    _damage(folder / "7")
    with pytest.raises(CheckpointError, match=r"checkpoint step 7 in .* cannot be read \(.*\); choose another step"):
        ckpt.restore_params(_abstract(like.train.params), step=7)
    assert (folder / "7").is_dir()
    ckpt.close()


@pytest.mark.parametrize("async_save", [False, True])
def test_a_step_saved_again_is_never_lost_while_the_new_save_is_written(tmp_path, tiny_model, monkeypatch,
                                                                         async_save):
    """Step 0 is saved again (the bootstrap's part-way state, then its end): its previous version
    stays until the new one is complete, so a process that dies while writing it leaves the run the
    previous version, not nothing."""
    folder = tmp_path / "checkpoints"
    first, second, like = (dataclasses.replace(_state(tiny_model, scale), step=0, phase="bootstrap", bootstrap_step=n,
                                               pool=[], pool_steps=[]) for scale, n in ((2.0, 3), (3.0, 6), (1.0, 0)))
    ckpt = Checkpointer(folder, async_save=async_save, writer=True)
    first.save(ckpt, seed=0, config_json="{}")
    second.save(ckpt, seed=0, config_json="{}")
    ckpt.wait()
    assert sorted(p.name for p in folder.iterdir()) == ["0"]
    assert RunState.restore(ckpt, like, None, log=lambda *_: None).bootstrap_step == 6

    def dies_while_writing(*args, **kwargs):
        raise KeyboardInterrupt  # the process is killed before the new save is complete
    monkeypatch.setattr(ckpt._manager, "save", dies_while_writing)
    with pytest.raises(KeyboardInterrupt):
        first.save(ckpt, seed=0, config_json="{}")
    assert not (folder / "0").exists()
    reader = Checkpointer(folder)  # eval or export meanwhile: it may not touch a save in progress
    assert reader.latest_step() is None and (folder / "0.replaced").is_dir()
    reader.close()
    again = Checkpointer(folder, async_save=async_save, writer=True)  # the run's next process
    assert RunState.restore(again, like, None, log=lambda *_: None).bootstrap_step == 6
    assert sorted(p.name for p in folder.iterdir()) == ["0"]
    again.close()


def test_a_bootstrap_state_keeps_its_progress_and_no_reference(tmp_path, tiny_model):
    saved = dataclasses.replace(_state(tiny_model, 2.0), step=0, phase="bootstrap", bootstrap_step=4, pool=[],
                                pool_steps=[])
    ckpt = Checkpointer(tmp_path / "checkpoints", async_save=False)
    saved.save(ckpt, seed=0, config_json="{}")
    like = _state(tiny_model, 1.0)
    restored = RunState.restore(ckpt, like, like.pool[0], log=lambda *_: None)
    assert (restored.phase, restored.bootstrap_step, restored.step, restored.reference) == ("bootstrap", 4, 0, None)
    ckpt.close()
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 3 .* holds steps 0"):
        Checkpointer(tmp_path / "checkpoints").restore_params(_abstract(like.train.params), step=3)
    with pytest.raises(ValueError, match="phase 'warmup'"):
        RunState(saved.train, phase="warmup")


def test_run_spec_reads_the_config_once_and_checks_it():
    c = base_config()
    c.games.update(env_ids=("TicTacToe-v0", "KuhnPoker-v1"), weights=(3.0, 1.0))
    c.rollout.update(max_in_flight=0, games_per_batch=8)
    spec = run_spec(c)
    np.testing.assert_allclose(spec.games.probabilities, [0.75, 0.25])
    assert spec.rollout.max_in_flight is None and spec.rollout.eval_in_flight == 8
    assert spec.evaluation.env_ids == ("TicTacToe-v0", "KuhnPoker-v1") and spec.bootstrap is None
    assert spec.evaluation.sampling.top_k == 0 and spec.rollout.sampling.max_new_tokens == 4096
    assert spec.cache_len >= spec.rollout.max_prompt_len + 4096
    for key, value, message in [("rollout.mode", "league", "rollout.mode='league'"),
                                ("eval.final_games", 3, "eval.final_games=3: .* even"),
                                ("games.weights", (1.0,), "2 games.env_ids"),
                                ("bootstrap.teacher", "oracle", "bootstrap.teacher='oracle'"),
                                # Values that would fail only at the first RL step, or mean something else.
                                ("out_dir", " ", "out_dir is empty"),  # checkpoints would go to /checkpoints
                                ("rollout.games_per_batch", 0, "games_per_batch=0: give at least 1"),
                                ("rollout.samples_per_step", 0, "samples_per_step=0: give at least 1"),
                                ("rollout.max_in_flight", -1, "max_in_flight=-1: give at least 0"),
                                ("train.steps", -4, "steps=-4: give at least 0"),
                                ("train.eval_every", -1, "eval_every=-1: give at least 0"),  # was: every step
                                ("train.checkpoint_every", -3, "checkpoint_every=-3: give at least 0"),
                                ("train.keep", 0, "keep=0: give at least 1"),
                                # --config.eval.opponents=random,scripted (one name, as the command line
                                # reads it): it would fail at the step-0 evaluation.
                                ("eval.opponents", ("random,scripted",), "'random,scripted' is not random, scripted")]:
        bad = base_config()
        bad.games.update(env_ids=("TicTacToe-v0", "KuhnPoker-v1"), weights=(1.0, 1.0))
        bad.bootstrap.enabled = True
        *section, name = key.split(".")
        (bad[section[0]] if section else bad)[name] = value
        with pytest.raises(ValueError, match=message):
            run_spec(bad)
    assert spec.compile_ahead == -1
    # A shell leaves --config.out_dir=~/x as written; folders starting with ~ are the home folder's.
    home = base_config()
    home.update(out_dir="~/runs/a")
    home.tokenizer.path = "~/tok"
    home.rollout.opponent = "~/frozen"
    spec = run_spec(home)
    assert spec.out_dir == os.path.expanduser("~/runs/a") != "~/runs/a"
    assert spec.tokenizer_path == os.path.expanduser("~/tok") and spec.rollout.opponent == os.path.expanduser("~/frozen")
    assert home.out_dir == "~/runs/a"  # the caller's config is left as it was
    bad = base_config()
    bad.compile_ahead = -2
    with pytest.raises(ValueError, match="compile_ahead=-2: .* -1 for the default"):
        run_spec(bad)


@pytest.mark.parametrize("key, value, message", [
    # Out of range, NaN and infinities: each fails at the first step, or trains something else quietly.
    ("seed", -1, r"seed=-1: give at least 0 and at most 4294967295"),  # was: at the first RL step
    ("seed", 2**32, r"seed=4294967296: .* at most 4294967295"),  # was: the same model as seed 0
    ("optim.learning_rate", -1e-6, r"optim.learning_rate=-1e-06: give at least 0"),  # gradient ascent
    ("optim.learning_rate", float("nan"), r"optim.learning_rate=nan: give a finite number, at least 0"),
    ("optim.kl_coef", -0.1, r"optim.kl_coef=-0.1: give at least 0"),
    ("optim.tis_cap", float("inf"), r"optim.tis_cap=inf: give a finite number, at least 0 \(0: off\)"),
    ("optim.b2", 1.0, r"optim.b2=1.0: give at least 0 and less than 1"),
    ("optim.logprob_chunk", 0, r"optim.logprob_chunk=0: give at least 1"),
    ("rollout.temperature", float("inf"), r"rollout.temperature=inf: give a finite number, at least 1e-05"),
    ("rollout.temperature", 0.0, r"rollout.temperature=0.0: give at least 1e-05"),  # RL samples; no greedy
    ("eval.temperature", 1e-6, r"eval.temperature=1e-06: give at least 1e-05 \(0: greedy"),
    ("eval.top_p", 1.5, r"eval.top_p=1.5: give more than 0 and at most 1"),
    ("rollout.pool_every", 0, r"rollout.pool_every=0: give at least 1"),  # was: ZeroDivisionError after a step
    ("rollout.pool_self_weight", 2.0, r"pool_self_weight=2.0: give at least 0 and at most 1"),
    ("games.max_turns", 0, r"games.max_turns=0: give at least 1"),
    ("rae.decay", 1.5, r"rae.decay=1.5: give at least 0 and at most 1"),
    ("train.transcripts", -1, r"train.transcripts=-1: give at least 0"),  # was: all but the last
    ("train.max_skipped_in_a_row", -1, r"max_skipped_in_a_row=-1: give at least 0 \(0: never stop\)"),
    ("eval.math.limit", -1, r"eval.math.limit=-1: give at least 0 \(0: every item\)"),
    ("eval.math.every", -1, r"eval.math.every=-1: give at least 0 \(0: never\)"),  # was: "needs files"
    ("model.random.num_kv_heads", 0, r"model.random.num_kv_heads=0: give at least 1"),  # was: ZeroDivisionError
    ("model.lora.alpha", 0.0, r"model.lora.alpha=0.0: give more than 0"),
    ("bootstrap.batch_size", 0, r"bootstrap.batch_size=0: give at least 1"),
    ("api.concurrency", 0, r"api.concurrency=0: give at least 1"),
    ("train.steps", 2**31, r"train.steps=2147483648: give at most 2147483647"),
    # Names the code reads only later (after the model is built), or never.
    ("rollout.schedule", "continous", r"rollout.schedule='continous'; use one of rounds, continuous"),
    ("bootstrap.targets", "all", r"bootstrap.targets='all'; use one of sampled, distribution"),
    ("model.compute_dtype", "bf16", r"model.compute_dtype='bf16'; use one of float32, bfloat16, float16"),
    ("optim.epochs", None, r"optim.epochs=None: give a whole number"),  # was: TypeError in TrainConfig
    # Types a config file can set and ml_collections lets through: None anywhere, a bool for a number.
    ("train.steps", None, r"train.steps=None: give a whole number"),
    ("train.keep", True, r"train.keep=True: give a whole number"),
    ("tokenizer.path", None, r"tokenizer.path=None: give a string"),
    ("games.invalid_rewards", (1.0,), r"games.invalid_rewards=\(1.0,\): give a tuple of two numbers"),
    ("eval.invalid_rewards", ("-1", "1"), r"eval.invalid_rewards=\('-1', '1'\): give a tuple of two numbers"),
    ("games.weights", ("1",), r"games.weights=\('1',\): give a tuple of numbers"),
    ("games.env_ids", (1,), r"games.env_ids=\(1,\): give a tuple of strings"),  # was: AttributeError
    ("eval.opponents", None, r"eval.opponents=None: give a tuple of strings"),  # was: TypeError
    ("eval.opponents", ("",), r"eval.opponents: player ''"),
    ("train", None, r"train is None, not a section; start the config from spiral_jax.config.base_config"),
])
def test_run_spec_names_a_bad_value_and_what_to_give(key, value, message):
    c = base_config()
    *section, name = key.split(".")
    node = c
    for part in section:
        node = node[part]
    node[name] = value
    with pytest.raises(ValueError, match=message):
        run_spec(c)


def test_eval_temperature_zero_decodes_greedily():
    c = base_config()
    c.eval.temperature, c.eval.math.temperature = 0.0, 0
    spec = run_spec(c)
    assert spec.evaluation.sampling.greedy and spec.evaluation.sampling.mode == "greedy"
    assert spec.evaluation.math.sampling.greedy
    assert not run_spec(base_config()).evaluation.sampling.greedy


@pytest.mark.parametrize("changes, error, message", [
    ({"rollout.mode": "fixed_opponent", "rollout.opponent": "no_such_folder"}, FileNotFoundError,
     "rollout.opponent='no_such_folder' is neither 'random', 'scripted'"),  # was: after the model was built
    # The trained model as its own fixed opponent: that is self-play or pool mode.
    ({"rollout.mode": "fixed_opponent", "rollout.opponent": "self"}, ValueError,
     "rollout.opponent='self' is the trained model, .* give --config.rollout.mode=self_play"),
    ({"rollout.mode": "fixed_opponent", "rollout.opponent": "pool/3"}, ValueError,
     "rollout.opponent='pool/3' is a snapshot of the trained model, .* give --config.rollout.mode=pool"),
    # A pool that never holds a snapshot while the run trains: plain self-play, refused.
    ({"rollout.mode": "pool", "rollout.pool_every": 10, "train.steps": 10}, ValueError,
     "first snapshot is taken after rollout.pool_every=10 steps, and train.steps=10 ends before"),
    ({"rollout.mode": "pool", "rollout.pool_self_weight": 1.0}, ValueError,
     "rollout.pool_self_weight=1 makes every game self-play, .* or --config.rollout.mode=self_play"),
    ({"games.env_ids": ("TicTacToe-v0", "KuhnPoker-v1")}, ValueError,  # weights left at one entry
     r"games.weights has 1 entries for 2 games.env_ids; give one weight per game, .*games.weights='\(1.0, 1.0\)'"),
    # A misspelt game names the key it is in and the nearest id.
    ({"games.env_ids": ("TicTacToe-v1",)}, ValueError,
     r"^games.env_ids: unknown env id 'TicTacToe-v1' \(did you mean 'TicTacToe-v0'\?\); known ids: "),
    ({"eval.env_ids": ("KuhnPokr-v1",)}, ValueError,
     r"^eval.env_ids: unknown env id 'KuhnPokr-v1' \(did you mean 'KuhnPoker-v1'\?\); known ids: "),
    ({"games.invalid_rewards": (0.5, -1.5)}, ValueError,  # swapped: an invalid move would be rewarded
     r"games.invalid_rewards=\(0.5, -1.5\) pays the player who moves invalidly more .* e.g. \(-1.5, 0.5\)"),
    ({"bootstrap.enabled": True, "bootstrap.teacher": "scripted", "bootstrap.targets": "distribution"}, ValueError,
     "bootstrap.targets='distribution' needs a random or hashed teacher"),  # was: at the first bootstrap step
    ({"distributed.enabled": True, "distributed.num_processes": 2, "distributed.process_id": 2}, ValueError,
     "distributed.process_id=2: give one below distributed.num_processes=2"),
    ({"optim.schedule": "cosine", "optim.decay_steps": 0}, ValueError,
     "optim.schedule='cosine' decays over optim.decay_steps; give at least 1"),  # was: no section named
])
def test_run_spec_refuses_values_that_do_not_go_together(changes, error, message):
    c = base_config()
    for key, value in changes.items():
        section, name = key.split(".")
        c[section][name] = value
    with pytest.raises(error, match=message):
        run_spec(c)


def test_run_spec_refuses_answers_past_the_checkpoint_context(tmp_path):
    """A checkpoint's max_position_embeddings bounds a prompt plus its answer; a random model's does not."""
    from spiral_jax.models import ModelConfig, save_pretrained
    from spiral_jax.models.params import init_params
    from tests.tiny_models import TINY_RUN

    cfg = ModelConfig(model_type="qwen3", **TINY_RUN, tie_word_embeddings=True)  # 512 positions
    save_pretrained(cfg, init_params(cfg, jax.random.key(0)), tmp_path)
    c = base_config()
    c.model.path = str(tmp_path)
    c.rollout.update(max_prompt_len=256, max_new_tokens=128)
    c.eval.max_new_tokens = 256
    assert run_spec(c).model.max_position_embeddings == 512
    c.eval.max_new_tokens = 257
    with pytest.raises(ValueError, match=r"max_prompt_len=256 \+ eval.max_new_tokens=257 .* max_position_embeddings=512"):
        run_spec(c)


def test_every_preset_passes_the_value_checks_and_every_checked_key_exists():
    from pathlib import Path

    from spiral_jax.config import CHOICES, NOTES, RANGES, check_values, config_from_file

    keys = {k for k, _ in base_config().items()} | {f"{s}.{k}" for s, v in base_config().items()
                                                      if hasattr(v, "items") for k, _ in v.items()}
    keys |= {f"{a}.{b}.{k}" for a, v in base_config().items() if hasattr(v, "items")
             for b, w in v.items() if hasattr(w, "items") for k, _ in w.items()}
    assert not [k for k in (*RANGES, *CHOICES, *NOTES) if k not in keys]
    for preset in sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.py")):
        check_values(config_from_file(str(preset)))
