"""LoRA runs: only the adapters train (the weights stay bit for bit, held in the compute dtype), the
sampler plays the merged policy, a resume is exact and refuses other base weights, and export
writes merged weights or a PEFT adapter folder."""
import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from spiral_jax.cli import main as cli_main
from spiral_jax.models import CheckpointError, load_pretrained, lora
from spiral_jax.run import Trainer
from spiral_jax.run.build import base_files, base_fingerprint
from tests.tiny_models import jit_forward
from tests.trainer.test_trainer import _config_file, tiny_config

LORA = {"model.lora.rank": 4, "model.lora.alpha": 8.0, "optim.learning_rate": 3e-3}


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def test_only_the_adapters_train_and_the_sampler_plays_the_merged_policy(tmp_path):
    trainer = Trainer.from_config(tiny_config(tmp_path, **LORA, **{"train.steps": 2, "train.eval_every": 0,
                                                       "eval.final_games": 0}), log=lambda *_: None)
    weights, adapters = _leaves(trainer.weights), _leaves(trainer.state.train.params)
    names = {k for layer in trainer.state.train.params["layers"] for k in layer}
    assert names == {f"{t}_lora_{ab}" for t in ("q", "k", "v", "o", "gate", "up", "down") for ab in "ab"}
    moments = jax.tree.leaves(trainer.state.train.opt_state)
    assert sum(x.size for x in moments) < 3 * sum(x.size for x in adapters) + 16  # Adam: 2 moments per adapter
    trainer.run()
    assert all(np.array_equal(a, b) for a, b in zip(weights, _leaves(trainer.weights)))  # frozen
    assert any(not np.array_equal(a, b) for a, b in zip(adapters, _leaves(trainer.state.train.params)))  # trained
    # What the sampler reads is the merged model.
    cfg = trainer.cfg
    merged = jax.device_get(trainer.to_sampler(trainer.state.train.params))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
    np.testing.assert_allclose(jit_forward(merged, cfg.base(), ids),
                               jit_forward(lora.join(trainer.weights, trainer.state.train.params), cfg, ids), atol=1e-5)


def test_a_lora_resume_is_exact_and_refuses_other_weights(tmp_path):
    changes = {**LORA, "train.eval_every": 0, "eval.final_games": 0}
    full = Trainer.from_config(tiny_config(tmp_path / "a", **changes, **{"train.steps": 4}), log=lambda *_: None)
    full.run()
    first = Trainer.from_config(tiny_config(tmp_path / "b", **changes, **{"train.steps": 2}), log=lambda *_: None)
    first.run()
    resumed = Trainer.from_config(tiny_config(tmp_path / "b", **changes, **{"train.steps": 4}), resume=True, log=lambda *_: None)
    assert resumed.state.step == 2
    resumed.run()
    for a, b in zip(_leaves(full.state.train), _leaves(resumed.state.train)):
        np.testing.assert_array_equal(a, b)
    assert full.state.rae == resumed.state.rae
    with pytest.raises(CheckpointError, match=r"trained on the random init of model.random with seed=0 \(random:.*"
                                              r"give an empty model.path and --config.seed=0"):
        Trainer.from_config(tiny_config(tmp_path / "b", **changes, **{"train.steps": 6, "seed": 1}), resume=True,
                log=lambda *_: None)
    # Another alpha would scale the trained adapters otherwise: refused as eval and export refuse it.
    with pytest.raises(CheckpointError, match=r"model.lora.alpha=8.0, this config sets 4.0.*alpha=8.0"):
        Trainer.from_config(tiny_config(tmp_path / "b", **{**changes, "train.steps": 6, "model.lora.alpha": 4.0}),
                            resume=True, log=lambda *_: None)


def _base_folder(tmp_path):
    """A Hugging Face folder of the tiny run model (random weights) for a LoRA run to start from."""
    from spiral_jax.models import init_params, save_pretrained
    from spiral_jax.run.setup import run_spec

    cfg = run_spec(tiny_config(tmp_path / "shape")).model.base()
    return save_pretrained(cfg, init_params(cfg, jax.random.key(3)), tmp_path / "base")


def test_export_merged_or_as_a_peft_adapter(tmp_path, capsys):
    base = _base_folder(tmp_path)
    config = _config_file(tmp_path, **LORA, **{"model.path": str(base), "train.steps": 2, "train.eval_every": 0,
                                               "eval.final_games": 0})
    assert cli_main(["spiral-jax", "train", f"--config={config}"]) == 0
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'merged'}"]) == 0
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'adapter'}", "--adapter"]) == 0
    config_json = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config_json["r"] == 4 and config_json["lora_alpha"] == 8.0 and "q_proj" in config_json["target_modules"]
    assert config_json["base_model_name_or_path"] == str(base)
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size > 0
    cfg, merged = load_pretrained(tmp_path / "merged")
    assert cfg.lora_rank == 0
    trainer = Trainer.from_config(tiny_config(tmp_path, **LORA, **{"model.path": str(base), "train.steps": 2}),
                                  resume=True, log=lambda *_: None)
    assert trainer.state.lora_base_files == base_files(trainer.spec)  # as checked: the next checkpoint keeps them
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 9))
    np.testing.assert_allclose(jit_forward(merged, cfg, ids),
                               jit_forward(lora.join(trainer.weights, trainer.state.train.params), trainer.cfg, ids), atol=1e-5)
    # Another alpha would scale the adapters otherwise: refused, with the one they were trained with.
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'other'}",
                     "--config.model.lora.alpha=16.0"]) == 1
    assert "trained with model.lora.alpha=8.0" in capsys.readouterr().err and not (tmp_path / "other").exists()
    # The base folder moved: named, with the flag that finds it; the adapter then names where it is now.
    moved = base.rename(tmp_path / "moved")
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'other'}", "--adapter"]) == 1
    assert (f"model.path={str(base)!r} does not exist; give the Hugging Face checkpoint folder (moved: "
            f"--config.model.path=WHERE_IT_IS_NOW" in capsys.readouterr().err and not (tmp_path / "other").exists())
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'other'}", "--adapter",
                     f"--config.model.path={moved}"]) == 0
    assert json.loads((tmp_path / "other" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(moved)
    # Other weights (a file changed) are refused, naming the folder the run trained on.
    weights = load_file(moved / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] + 1.0
    save_file(weights, moved / "model.safetensors")
    assert cli_main(["spiral-jax", "export", f"--config={config}", f"--out={tmp_path / 'third'}", "--adapter",
                     f"--config.model.path={moved}"]) == 1
    err = capsys.readouterr().err
    assert f"holds LoRA adapters trained on model.path={str(base)!r} (sha256:" in err, err
    assert f"give --config.model.path=FOLDER, where FOLDER holds the very files of {base}" in err
    assert not (tmp_path / "third").exists()


def test_the_lora_base_is_read_again_only_when_its_files_change(tmp_path, monkeypatch):
    """A checkpoint's fingerprint of model.path is taken as it is while the files keep their names, sizes
    and modification times (a moved folder too); a touched or rewritten file is hashed again."""
    from spiral_jax.run import build
    from spiral_jax.run.setup import run_spec

    base = _base_folder(tmp_path)
    spec = run_spec(tiny_config(tmp_path, **LORA, **{"model.path": str(base)}))
    files, fingerprint = base_files(spec), base_fingerprint(spec)
    assert [f[0] for f in files] == ["config.json", "model.safetensors"]
    reads, real_open = [], open
    monkeypatch.setattr(build, "open", lambda f, *a, **k: reads.append(f.name) or real_open(f, *a, **k), raising=False)
    assert base_fingerprint(spec, (fingerprint, files)) == fingerprint and reads == []
    moved = run_spec(tiny_config(tmp_path, **LORA, **{"model.path": str(base.rename(tmp_path / "moved"))}))
    assert base_fingerprint(moved, (fingerprint, files)) == fingerprint and reads == []
    weights = tmp_path / "moved" / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched, the same bytes
    assert base_fingerprint(moved, (fingerprint, files)) == fingerprint and "model.safetensors" in reads
    tensors = load_file(weights)
    tensors["model.norm.weight"] = tensors["model.norm.weight"] + 1.0
    save_file(tensors, weights)  # rewritten: other bytes
    assert base_fingerprint(moved, (fingerprint, files)) != fingerprint


def test_lora_settings_without_a_rank_are_refused(tmp_path):
    """model.lora.alpha, targets or sample given with rank 0 would run a full fine-tune unasked."""
    from spiral_jax.run.setup import run_spec

    for key, value in (("alpha", 32.0), ("targets", ("q", "v")), ("sample", "adapters")):
        with pytest.raises(ValueError, match=rf"model.lora.{key}=.* but model.lora.rank=0, which trains no adapters "
                                             rf"\(full fine-tuning\); give --config.model.lora.rank=N"):
            run_spec(tiny_config(tmp_path, **{f"model.lora.{key}": value}))
    run_spec(tiny_config(tmp_path, **{"model.lora.targets": ("down", "up", "gate", "o", "v", "k", "q")}))  # defaults
