"""The self-play trainer end to end on a tiny random model: modes, resume, SIGTERM, export, errors."""
import os
import signal

import jax
import numpy as np
import pytest
import torch
import transformers

from spiral_jax.cli import main as cli_main
from spiral_jax.config import base_config, config_from_file
from spiral_jax.models import CheckpointError, load_pretrained
from spiral_jax.run import Trainer
from spiral_jax.run.collect import draw_seats
from tests.tiny_models import TINY_RUN, jit_forward

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_config(tmp_path, **changes):
    c = base_config()
    c.out_dir = str(tmp_path / "run")
    c.model.random.update(TINY_RUN)
    c.tokenizer.path = "embedded"
    c.rollout.update(games_per_batch=4, samples_per_step=16, max_new_tokens=8, max_prompt_len=256)
    c.optim.update(learning_rate=1e-3, micro_batch_size=8, logprob_chunk=64)  # 8 fake devices
    c.train.update(steps=3, eval_every=2, checkpoint_every=2, async_checkpointing=False)
    c.eval.update(games=2, final_games=4, max_new_tokens=8)
    for key, value in changes.items():
        *sections, name = key.split(".")
        node = c
        for section in sections:
            node = node[section]
        node[name] = value
    c.lock()
    return c


def _assert_only_the_model_is_trained(samples, games):
    """Every training sample is a turn the trained model played, none an opponent's."""
    model_responses = {tuple(t.response_ids) for g in games for t in g.model_turns if t.policy == "model"}
    assert samples and all(tuple(s.response_ids) in model_responses for s in samples)


@pytest.mark.parametrize("changes", [
    {},
    {"rollout.mode": "fixed_opponent", "rollout.opponent": "random"},
    {"rollout.mode": "pool", "rollout.pool_every": 1, "rollout.pool_self_weight": 0.0, "rollout.opponent": "scripted"},
    pytest.param({"games.env_ids": ("TicTacToe-v0", "KuhnPoker-v1"), "games.weights": (1.0, 1.0),
                  "rollout.selection": "all", "eval.kuhn_samples": 0}, marks=pytest.mark.slow),
    pytest.param({"rollout.mode": "pool", "rollout.pool_every": 1, "rollout.schedule": "continuous",
                  "rollout.max_in_flight": 2}, marks=pytest.mark.slow),
], ids=["self_play", "fixed_opponent", "pool", "two_games", "continuous"])
def test_three_steps_in_every_mode(tmp_path, changes):
    """A random model writes garbage: every game still ends (invalid moves), nothing crashes."""
    logged = []
    trainer = Trainer.from_config(tiny_config(tmp_path, **changes), log=logged.append)
    results = trainer.run()
    mode, opponent = changes.get("rollout.mode", "self_play"), changes.get("rollout.opponent", "random")
    if mode == "fixed_opponent":  # the start banner names the fixed opponent, or says it is not played
        mode += f" against {opponent}"
    elif opponent != "random":
        mode += f" (rollout.opponent={opponent} is not played: fixed_opponent plays it)"
    assert any(f"rollout {mode}, 3 steps" in str(line) for line in logged), logged[:2]
    assert trainer.state.step == 3 and int(trainer.state.train.step) == 3
    assert results and all(s.games == 4 for s in results.values())
    assert trainer.ckpt.latest_step() == 3
    baselines = trainer.state.rae["baselines"]
    assert set(baselines) <= set(trainer.spec.games.env_ids) and baselines
    if changes.get("rollout.mode") == "pool":
        assert trainer.state.pool_steps == [1, 2, 3][-trainer.spec.rollout.pool_size:]
        if changes.get("rollout.pool_self_weight") == 0.0:  # every game against a snapshot, its seat by the LLM
            collected = trainer.collect()
            samples, games = collected.samples, collected.games
            pools = {f"pool/{s}" for s in trainer.state.pool_steps}
            assert all(g.seats.count("model") == 1 and set(g.seats) - {"model"} <= pools for g in games)
            assert any(t.policy in pools for g in games for t in g.model_turns)
            _assert_only_the_model_is_trained(samples, games)
    from spiral_jax.metrics import read_scalars
    scalars = read_scalars(tmp_path / "run" / "tensorboard")
    for tag in ("train/loss", "train/grad_norm", "train/entropy", "rollout/valid_action_rate",
                "time/sampling", "time/update", "throughput/sampled_tokens_per_s",
                "throughput/trained_tokens_per_s", "throughput/games_per_s", "rollout/invalid/no_box",
                "rollout/invalid/cut_at_token_limit", "rollout/slot_utilization", "rollout/prefill_saved"):
        assert len(scalars[tag]) == 3 and all(np.isfinite(v) for _, v in scalars[tag])
    assert scalars["rollout/TicTacToe-v0/role0/response_tokens_p95"]  # steps that played that game
    games = [v for _, v in scalars["totals/games"]]
    assert games == sorted(games) and games[0] > 0 and games[-1] == trainer.state.totals["games"]
    assert [step for step, _ in scalars["time/eval"]] == [0, 2, 3]  # step 0, periodic, final
    assert all(v >= 0 for _, v in scalars["time/checkpoint"])
    assert [step for step, _ in scalars["compile/new_executables"]] == [1, 2, 3]
    assert scalars["compile/new_executables"][0][1] > 0  # the first step compiles (or loads) its programs
    assert any(t.startswith("rae/baseline/") for t in scalars)
    assert any(t.startswith("eval/") for t in scalars)
    assert list((tmp_path / "run" / "eval" / "step3").glob("*.jsonl"))  # eval transcripts
    if "eval.kuhn_samples" in changes:  # exact scoring refuses a model that never writes the answers
        assert "eval/kuhn/exploitability" not in scalars


def test_pool_games_draw_snapshots_at_the_configured_weight():
    """In pool mode a game is self-play with probability pool_self_weight, else the model plays a
    uniformly drawn snapshot, from both seats."""
    n, weight = 4000, 0.25
    seats = draw_seats(np.random.default_rng(0), n, "pool", "random", [3, 6], weight)
    self_play = sum(s == ("model", "model") for s in seats)
    assert abs(self_play / n - weight) < 4 * (weight * (1 - weight) / n) ** 0.5
    against = [s for s in seats if s != ("model", "model")]
    assert all(s.count("model") == 1 and {*s} - {"model"} <= {"pool/3", "pool/6"} for s in against)
    snapshot3 = sum("pool/3" in s for s in against) / len(against)
    model_first = sum(s[0] == "model" for s in against) / len(against)
    for share in (snapshot3, model_first):
        assert abs(share - 0.5) < 4 * (0.25 / len(against)) ** 0.5
    rng = np.random.default_rng(1)
    assert draw_seats(rng, 50, "pool", "random", [], weight) == [("model", "model")] * 50  # empty pool
    assert ("model", "model") not in draw_seats(rng, 50, "pool", "random", [3], 0.0)
    assert draw_seats(rng, 4, "fixed_opponent", "frozen", [3], weight) == [("model", "frozen"), ("frozen", "model")] * 2


def test_fixed_opponent_can_be_a_frozen_model_folder(tmp_path):
    """A checkpoint folder as the fixed opponent: sampled in the same program, never trained."""
    first = Trainer.from_config(tiny_config(tmp_path / "a", **{"train.steps": 1}), log=lambda *_: None)
    from spiral_jax.models import save_pretrained
    save_pretrained(first.cfg, first.state.train.params, tmp_path / "frozen")
    trainer = Trainer.from_config(tiny_config(tmp_path / "b", **{"rollout.mode": "fixed_opponent",
                                                     "rollout.opponent": str(tmp_path / "frozen")}),
                      log=lambda *_: None)
    frozen = [np.asarray(x) for x in jax.tree.leaves(trainer.frozen["frozen"])]
    collected = trainer.collect()
    samples, games = collected.samples, collected.games
    assert all(sorted(g.seats) == ["frozen", "model"] for g in games)
    assert any(t.policy == "frozen" for g in games for t in g.model_turns)  # the LLM played its seat
    _assert_only_the_model_is_trained(samples, games)
    trainer.train_step()
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(frozen, jax.tree.leaves(trainer.frozen["frozen"])))
    with pytest.raises(FileNotFoundError, match="neither 'random', 'scripted', an API model .* nor a model folder"):
        Trainer.from_config(tiny_config(tmp_path / "c", **{"rollout.mode": "fixed_opponent", "rollout.opponent": "nope"}))


def test_fixed_opponent_can_be_an_api_model(tmp_path, tiny_model):
    """An openai:NAME@URL fixed opponent (here a model served by spiral-jax serve) plays its seat in
    every training game; only the trained model's turns become samples. A dead endpoint is an error
    before the run."""
    from spiral_jax.sampling import Sampler
    from spiral_jax.serve import ChatServer

    cfg, params, tokenizer = tiny_model
    server = ChatServer(Sampler(cfg, None, max_prompt_len=512, max_cache_len=640), tokenizer, params, "other",
                        port=0, max_tokens=8)
    server.start()
    try:
        spec = f"openai:other@{server.url}"
        trainer = Trainer.from_config(tiny_config(tmp_path / "a", **{"rollout.mode": "fixed_opponent", "rollout.opponent": spec}),
                          log=lambda *_: None)
        collected = trainer.collect()
        samples, games = collected.samples, collected.games
        assert all(sorted(g.seats) == sorted(["model", spec]) for g in games)
        api_turns = [t for g in games for t in g.record.turns if g.seats[t.player] == spec]
        assert api_turns and all(t.response for t in api_turns)  # the served model's text
        assert all(t.policy == "model" for g in games for t in g.model_turns) and samples
        assert trainer.rollout.api_player(spec).calls == len(api_turns) and server.answers_started >= len(api_turns)
    finally:
        server.close()
    with pytest.raises(ConnectionError, match="cannot reach the API opponent"):
        Trainer.from_config(tiny_config(tmp_path / "b", **{"eval.opponents": ("openai:m@http://127.0.0.1:9/v1",)}))


def _params(trainer):
    return [np.asarray(x) for x in jax.tree.leaves(trainer.state.train.params)]


def test_resume_continues_exactly(tmp_path):
    full = Trainer.from_config(tiny_config(tmp_path / "a", **{"train.steps": 4}), log=lambda *_: None)
    full.run()
    first = Trainer.from_config(tiny_config(tmp_path / "b", **{"train.steps": 2}), log=lambda *_: None)
    first.run()
    resumed = Trainer.from_config(tiny_config(tmp_path / "b", **{"train.steps": 4}), resume=True, log=lambda *_: None)
    assert resumed.state.step == 2
    resumed.run()
    for a, b in zip(_params(full), _params(resumed)):
        np.testing.assert_array_equal(a, b)
    assert full.state.rae == resumed.state.rae


def test_a_pool_resumed_with_a_smaller_pool_size_keeps_its_newest_snapshots(tmp_path):
    """After a resume that lowers pool_size, the pool holds the newest pool_size snapshots, and only they
    are drawn as opponents. Resumed in another mode, the run holds no snapshot."""
    pool = {"rollout.mode": "pool", "rollout.pool_every": 1, "rollout.pool_self_weight": 0.0}
    first = Trainer.from_config(tiny_config(tmp_path, **pool, **{"train.steps": 2, "rollout.pool_size": 2}),
                                log=lambda *_: None)
    first.run()
    assert first.state.pool_steps == [1, 2]
    resumed = Trainer.from_config(tiny_config(tmp_path, **pool, **{"train.steps": 3, "rollout.pool_size": 1}),
                                  resume=True, log=lambda *_: None)
    assert resumed.state.pool_steps == [2] and len(resumed.state.pool) == 1
    assert {g.seats[1 - g.seats.index("model")] for g in resumed.collect().games} == {"pool/2"}
    resumed.run()
    assert resumed.state.pool_steps == [3] and len(resumed.state.pool) == 1
    self_play = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 3}), resume=True, log=lambda *_: None)
    assert self_play.state.step == 3 and self_play.state.pool == [] and self_play.state.pool_steps == []


def test_resume_on_another_mesh_restores_the_same_state_in_the_new_layout(tmp_path):
    """A run preempted on one slice and resumed on another (docs/running.md: a larger slice adds fsdp):
    the checkpoint written on fsdp 2 x tensor 4 restores on fsdp 8 x tensor 1, every array of the train
    state equal to what was saved and laid out on the new mesh, and training goes on from there."""
    first = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 2, "mesh.fsdp": 2, "mesh.tensor": 4}),
                                log=lambda *_: None)
    first.run()
    saved = [np.asarray(x) for x in jax.tree.leaves(first.state.train)]
    lines = []
    resumed = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 3, "mesh.fsdp": 8, "mesh.tensor": 1}),
                                  resume=True, log=lines.append)
    assert resumed.state.step == 2 and resumed.state.rae == first.state.rae
    # The log says what the resumed run sets otherwise than the checkpoint's, and nothing else.
    assert ("resuming with 3 config value(s) other than the checkpoint's: mesh.fsdp: 2 -> 8; "
            "mesh.tensor: 4 -> 1; train.steps: 2 -> 3") in lines
    leaves = jax.tree.leaves(resumed.state.train)
    assert len(leaves) == len(saved)
    for want, got in zip(saved, leaves):
        np.testing.assert_array_equal(want, np.asarray(got))
    axes = {name: size for name, size in resumed.mesh.shape.items() if size > 1}
    assert axes == {"fsdp": 8}, resumed.mesh.shape
    assert any(x.sharding.mesh.shape == resumed.mesh.shape and not x.sharding.is_fully_replicated for x in leaves)
    resumed.run()
    assert resumed.state.step == 3


def test_kl_penalty_is_taken_against_the_policy_rl_started_from(tmp_path):
    """optim.kl_coef: the reference is the step-0 policy, frozen, and a resumed run restores it from
    the checkpoint rather than taking the policy it resumes with."""
    from spiral_jax.metrics import read_scalars

    changes = {"optim.kl_coef": 0.5, "train.eval_every": 0, "eval.final_games": 0}
    first = Trainer.from_config(tiny_config(tmp_path, **changes, **{"train.steps": 2}), log=lambda *_: None)
    start = _params(first)
    first.run()
    assert all(np.any(a != b) for a, b in zip(start, _params(first)) if a.ndim == 2), "the policy moved"
    kl = dict(read_scalars(tmp_path / "run" / "tensorboard")["train/kl"])
    assert kl[1] == 0.0 and kl[2] > 0.0  # step 1 updates the reference itself; step 2 a moved policy
    resumed = Trainer.from_config(tiny_config(tmp_path, **changes, **{"train.steps": 3}), resume=True, log=lambda *_: None)
    assert resumed.state.step == 2
    resumed.run()
    assert resumed.state.step == 3
    reference = jax.tree.leaves(resumed.state.reference)
    assert len(reference) == len(start)
    for a, b in zip(start, reference):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_sigterm_saves_and_exits(tmp_path):
    trainer = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 100, "train.checkpoint_every": 50}),
                      log=lambda *_: None)
    step = trainer.train_step

    def step_then_signal():
        metrics = step()
        if trainer.state.step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    trainer.train_step = step_then_signal
    assert trainer.run() == {}
    assert trainer.state.step == 2 and trainer.ckpt.latest_step() == 2
    resumed = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 3}), resume=True, log=lambda *_: None)
    assert resumed.state.step == 2


def _config_file(tmp_path, **changes):
    """A config file for the CLI: tiny_config(tmp_path, **changes)."""
    config = tmp_path / "cfg.py"
    config.write_text(
        "from tests.trainer.test_trainer import tiny_config\n"
        "from pathlib import Path\n"
        f"def get_config():\n    return tiny_config(Path({str(tmp_path)!r}), **{changes!r})\n")
    return config


def test_export_loads_in_transformers(tmp_path, capsys):
    config = _config_file(tmp_path)
    assert cli_main(["spiral-jax", "train", f"--config={config}", "--config.train.steps=2",
                     "--config.train.checkpoint_every=1"]) == 0
    (tmp_path / "a_file").write_text("")
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'a_file'}"]) == 1
    assert "is a file; export writes a folder" in capsys.readouterr().err
    out = tmp_path / "exported"
    # Exported on another mesh than the run trained on (fsdp 8): the weights are read into its layout.
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={out}", "--config.mesh.fsdp=2",
                     "--config.mesh.tensor=4"]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    trainer = Trainer.from_config(tiny_config(tmp_path), resume=True, log=lambda *_: None)
    ids = np.asarray([tokenizer.encode("Free cells: [0], [4]. \\boxed{4}")])
    ours = np.asarray(jit_forward(trainer.state.train.params, trainer.cfg, ids))
    with torch.no_grad():
        theirs = model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4)
    assert load_pretrained(out)[0] == trainer.cfg.replace(remat=True)  # strict: no tensor missing
    # --step: an earlier checkpoint's weights (step 1's, before the last update); a step not saved is named.
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'step1'}", "--step=1"]) == 0
    assert "[export] the checkpoint of step 1 in" in capsys.readouterr().err
    before = np.asarray(jit_forward(load_pretrained(tmp_path / "step1")[1], trainer.cfg, ids))
    assert not np.allclose(before, ours, atol=1e-4)
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'step7'}", "--step=7"]) == 1
    assert "no checkpoint of step 7" in capsys.readouterr().err and not (tmp_path / "step7").exists()
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'x'}", "--step=-2"]) == 1
    assert "--step=-2: give the training step of a checkpoint" in capsys.readouterr().err
    assert cli_main(["spiral-jax", "serve", f"--config={config}", "--port=0", "--step=7"]) == 1  # before serving
    assert "no checkpoint of step 7" in capsys.readouterr().err


@pytest.mark.slow
def test_kuhn_paper_config_runs_one_step_with_tiny_sizes(tmp_path):
    c = config_from_file(os.path.join(REPO, "configs", "spiral_kuhn_qwen3_4b.py"))
    c.out_dir = str(tmp_path)
    c.model.path = ""  # random weights, same architecture (qwen3, tied, q/k norm), tiny sizes
    c.model.update(compute_dtype="float32")
    c.model.random.update(TINY_RUN, max_position_embeddings=1024)
    c.tokenizer.path = "embedded"
    c.rollout.update(games_per_batch=4, samples_per_step=8, max_new_tokens=16, max_prompt_len=512)
    c.optim.update(micro_batch_size=8)
    c.train.update(steps=1, async_checkpointing=False)
    c.eval.update(final_games=2, max_new_tokens=16)
    trainer = Trainer.from_config(c, log=lambda *_: None)
    assert trainer.cfg.scan_layers and trainer.spec.train.epochs == 2 and trainer.spec.train.normaliser_constant == 4096
    results = trainer.run()
    assert int(trainer.state.train.step) == 2  # PPO: two optimizer steps per iteration
    # trained on Kuhn poker, evaluated on Kuhn poker and TicTacToe, as the reference does online
    assert sorted(results) == [(g, o) for g in ("KuhnPoker-v1", "TicTacToe-v0") for o in ("random", "scripted")]


# ------------------------------------------------------------------------------------------ errors

def test_bad_config_key_is_an_error(tmp_path, capsys):
    code = cli_main(["spiral-jax", "train", f"--config={REPO}/configs/tiny_tictactoe.py",
                     "--config.train.stepz=3"])
    assert code == 2 and "stepz" in capsys.readouterr().err


def test_missing_config_file_is_an_error(tmp_path, capsys):
    for extra in ([], ["--config.train.steps=3"]):
        code = cli_main(["spiral-jax", "train", f"--config={tmp_path}/no_such_config.py", *extra])
        err = capsys.readouterr().err
        assert code == 2 and "cannot load the config file" in err and "no_such_config.py" in err
        assert "Traceback" not in err


def test_full_disk_is_a_clear_error_and_loses_no_checkpoint(tmp_path, capsys, monkeypatch):
    import errno

    import orbax.checkpoint as ocp

    from spiral_jax.checkpoint import is_disk_full

    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied")) and not is_disk_full(ValueError("x"))
    save = ocp.CheckpointManager.save

    def save_until_the_disk_fills(manager, step, *args, **kwargs):
        if step >= 2:  # what orbax raises on a full disk (tensorstore's error, seen on a full tmpfs)
            raise ValueError("RESOURCE_EXHAUSTED: Error writing \"opt_state\" in OCDBT database: Failed to "
                             "write 71569 bytes to file 15: No space left on device [os_error_code='28']")
        return save(manager, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", save_until_the_disk_fills)
    config = _config_file(tmp_path, **{"train.checkpoint_every": 1})
    assert cli_main(["spiral-jax", "train", f"--config={config}"]) == 1
    err = capsys.readouterr().err
    assert "the checkpoint of step 2 could not be written" in err and "is full" in err
    assert "--resume (the newest complete checkpoint, step 1)" in err
    monkeypatch.setattr(ocp.CheckpointManager, "save", save)  # space freed
    assert Trainer.from_config(tiny_config(tmp_path), resume=True, log=lambda *_: None).state.step == 1


def test_unknown_env_id(tmp_path):
    with pytest.raises(ValueError, match="Chess-v0.*TicTacToe-v0"):
        Trainer.from_config(tiny_config(tmp_path, **{"games.env_ids": ("Chess-v0",)}))


def test_a_run_that_cannot_start_fails_before_the_weights_are_loaded(tmp_path, monkeypatch):
    """A missing tokenizer, or a micro-batch that does not split the step's samples, is an error before
    build_model (which loads a checkpoint's weights: minutes for a real model), not after it."""
    from spiral_jax.run import loop

    def build_model(*_):
        raise AssertionError("the weights were loaded before the config was checked")

    monkeypatch.setattr(loop, "build_model", build_model)
    for changes, error, message in [({"tokenizer.path": str(tmp_path / "nope")}, CheckpointError, "does not exist"),
                                    ({"tokenizer.path": ""}, CheckpointError, "no tokenizer: set tokenizer.path"),
                                    ({"optim.micro_batch_size": 7}, ValueError, "micro_batch_size=7 must be .* divide")]:
        with pytest.raises(error, match=message):
            Trainer.from_config(tiny_config(tmp_path, **changes), log=lambda *_: None)


def test_missing_checkpoint(tmp_path):
    c = tiny_config(tmp_path)
    with c.unlocked():
        c.model.path = str(tmp_path / "no_such_model")
    with pytest.raises(CheckpointError, match="does not exist"):
        Trainer.from_config(c)
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from"):
        Trainer.from_config(tiny_config(tmp_path), resume=True)


def test_tokenizer_that_does_not_fit_the_model(tmp_path):
    c = tiny_config(tmp_path)
    c.model.random.vocab_size = 1000
    with pytest.raises(CheckpointError, match="2048 tokens but the model's embedding has only 1000 rows"):
        Trainer.from_config(c)


@pytest.mark.parametrize("dtype, tolerance", [
    ("float32", 1e-5),
    # bf16 compute rounds activations to 8 bits of mantissa (relative 2^-8 = 4e-3); the sampler and the
    # learner run different programs (cached decode against one full forward), so their log-probs may
    # differ by a few such roundings of the logits.
    pytest.param("bfloat16", 5e-2, marks=pytest.mark.slow),
])
def test_sampler_and_learner_logprobs_agree_and_nothing_recompiles(tmp_path, dtype, tolerance):
    """The learner's log-probs of the sampled tokens equal the sampler's (train/drift_max, measured
    end to end through rollout, packing and the update), and after the first step no program compiles."""
    trainer = Trainer.from_config(tiny_config(tmp_path, **{"train.steps": 4, "model.compute_dtype": dtype}),
                      log=lambda *_: None)
    metrics = [trainer.train_step() for _ in range(4)]
    assert all(m["train/drift_max"] < tolerance for m in metrics), [m["train/drift_max"] for m in metrics]
    assert metrics[0]["compile/new_executables"] > 0
    assert [m["compile/new_executables"] for m in metrics[1:]] == [0, 0, 0]


@pytest.mark.slow
def test_main_job_config_bootstraps_and_trains_one_step(tmp_path):
    """configs/tiny_pig.py, the README's main job, as it is (model, game, hashed teacher, optimiser),
    with fewer steps and games."""
    c = config_from_file(os.path.join(REPO, "configs", "tiny_pig.py"))
    c.out_dir = str(tmp_path)
    c.bootstrap.update(steps=3, batch_size=16)
    c.rollout.update(games_per_batch=2, samples_per_step=32)
    c.train.update(steps=1, async_checkpointing=False)
    c.eval.update(opponents=())  # evaluation is tested elsewhere
    trainer = Trainer.from_config(c, log=lambda *_: None)
    trainer.run()
    from spiral_jax.metrics import read_scalars
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [s for s, _ in scalars["bootstrap/loss"]] == [0, 2] and trainer.state.step == 1
    assert trainer.summary.read()["bootstrap"] == {"teacher": "hashed", "steps": 3}


@pytest.mark.slow
def test_textarena_self_play_and_evaluation(tmp_path):
    """A TextArena game (one of the paper's evaluation games) in a self-play step and an evaluation
    against the model itself: the env's own rules judge the free-text moves."""
    pytest.importorskip("textarena")  # a test dependency; CI=true fails instead (tests/conftest.py)
    from spiral_jax.eval.suite import run_games
    from spiral_jax.metrics import read_scalars

    game = "textarena:TruthAndDeception-v0"
    trainer = Trainer.from_config(tiny_config(tmp_path, **{"games.env_ids": (game,), "eval.opponents": (),
                                               "rollout.max_prompt_len": 512, "train.steps": 1}),
                      log=lambda *_: None)
    trainer.run()
    valid = read_scalars(tmp_path / "run" / "tensorboard")["rollout/valid_action_rate"]
    assert valid and valid[0][1] > 0  # some free-text moves pass TextArena's own rules
    results = run_games(trainer.eval_context(), tmp_path / "eval", [game], ["self"], 2)
    assert list(results) == [(game, "self")] and results[game, "self"].games == 2
    with pytest.raises(ValueError, match="the random player needs a game that lists its legal moves"):
        Trainer.from_config(tiny_config(tmp_path / "b", **{"games.env_ids": (game,)}))
