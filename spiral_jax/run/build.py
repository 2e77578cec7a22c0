"""What a `RunSpec` builds: the model to train, its tokenizer, the policy that eval, export and serve
load from a checkpoint (or model.path), and the evaluation context of a policy."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jax
import jax.numpy as jnp

from spiral_jax.eval.suite import EvalContext
from spiral_jax.models import CheckpointError, ModelConfig, init_params, load_pretrained, lora
from spiral_jax.run.spec import RunSpec
from spiral_jax.sampling import Sampler
from spiral_jax.tokenizer import Tokenizer, load_tokenizer


def build_model(spec: RunSpec, mesh=None) -> tuple[ModelConfig, dict]:
    """The model to train (train layout): model.path's weights, else a random init of model.random;
    with LoRA, fresh adapters beside them (the weights are the same as without)."""
    cfg = spec.model
    if spec.model_path:
        _, params = load_pretrained(spec.model_path, mesh=mesh, compute_dtype=cfg.compute_dtype,
                                    scan_layers=cfg.scan_layers, remat=cfg.remat, remat_saves=cfg.remat_saves,
                                    attention=cfg.attention, decode_attention=cfg.decode_attention)
    else:
        params = init_params(cfg.base(), jax.random.key(spec.seed), mesh=mesh, dtype=jnp.float32)
    if cfg.lora_rank:
        params = lora.join(params, lora.init_adapters(cfg, jax.random.fold_in(jax.random.key(spec.seed), 1), mesh))
    return cfg, params


def _base_files(spec: RunSpec) -> list[Path]:
    folder = Path(spec.model_path)
    return [folder / "config.json", *sorted(folder.glob("*.safetensors"))]


def base_files(spec: RunSpec) -> list | None:
    """[name, size, modification time in ns] of each file `base_fingerprint` hashes; None for a random
    init. A checkpoint keeps them beside the fingerprint."""
    if not spec.model_path:
        return None
    return [[f.name, (st := f.stat()).st_size, st.st_mtime_ns] for f in _base_files(spec)]


def base_fingerprint(spec: RunSpec, known: tuple[str | None, list | None] = (None, None)) -> str:
    """What identifies the frozen weights LoRA adapters are trained on: a hash of model.path's
    config.json and weight files (their bytes), or the random init's shape and seed. `known`: a
    fingerprint and the `base_files` it was taken of (a checkpoint's record). While the files keep
    those names, sizes and modification times (as rsync and make judge a file unchanged), that
    fingerprint is the answer, and resume, eval, export and serve do not read every weight twice."""
    if not spec.model_path:
        return "random:" + hashlib.sha256(json.dumps([spec.random_shape, spec.seed], sort_keys=True)
                                          .encode()).hexdigest()[:16]
    fingerprint, files = known
    if fingerprint and files and files == base_files(spec):
        return fingerprint
    digest = hashlib.sha256()
    for f in _base_files(spec):
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


def _base_weights(spec: RunSpec, mesh, rules: str = "sample"):
    """The weights LoRA adapters sit on: model.path's, else the random init (as `build_model`)."""
    from spiral_jax.models import load_policy_weights

    cfg = spec.model
    if spec.model_path:
        return load_policy_weights(spec.model_path, cfg.base(), mesh)
    return init_params(cfg.base(), jax.random.key(spec.seed), mesh=mesh, dtype=jnp.float32, rules=rules)


def check_lora_alpha(config_json: str | None, cfg: ModelConfig, source: str) -> None:
    """Adapters trained with another model.lora.alpha (in the config JSON a checkpoint keeps) would be
    scaled otherwise by this config: refused, naming the value to give."""
    alpha = json.loads(config_json or "{}").get("model", {}).get("lora", {}).get("alpha")
    if alpha is not None and float(alpha) != cfg.lora_alpha:
        raise CheckpointError(f"{source} holds LoRA adapters trained with model.lora.alpha={alpha}, this config "
                              f"sets {cfg.lora_alpha}, which would scale them otherwise: give "
                              f"--config.model.lora.alpha={alpha}")


def check_lora_base(saved: str | None, saved_files: list | None, config_json: str | None, spec: RunSpec,
                    source: str) -> None:
    """Adapters trained on other frozen weights than this config's (another model.path, its files
    changed, another random init) would sit on the wrong weights: refused, naming the weights the run
    that wrote them trained on (the config JSON a checkpoint keeps). `saved`, `saved_files`: the
    checkpoint's fingerprint and the files it was taken of (`base_fingerprint`); both None for a full
    fine-tune."""
    current = base_fingerprint(spec, (saved, saved_files)) if spec.model.lora_rank else None
    if saved == current:
        return
    if saved is None or current is None:
        raise CheckpointError(f"{source} was written by a {'full fine-tuning' if saved is None else 'LoRA'} run and "
                              f"this config {'trains LoRA adapters' if saved is None else 'has model.lora.rank=0'}; "
                              f"give the model.lora settings it was written with (out_dir/config.json)")
    trained = json.loads(config_json or "{}")
    path, seed = trained.get("model", {}).get("path"), trained.get("seed")
    was = f"model.path={path!r}" if path else f"the random init of model.random with seed={seed}"
    now = f"model.path={spec.model_path!r}" if spec.model_path else f"the random init with seed={spec.seed}"
    fix = (f"--config.model.path=FOLDER, where FOLDER holds the very files of {path} (moved there, or copied byte "
           f"for byte)" if path else f"an empty model.path and --config.seed={seed}, as the run trained")
    raise CheckpointError(f"{source} holds LoRA adapters trained on {was} ({saved}), not on the weights of {now} "
                          f"({current}), which they do not fit: give {fix}")


def checkpoint_step(flag: int) -> int | None:
    """The checkpoint a --step flag names for `load_policy`: None (the newest) for -1, the default."""
    if flag < -1:
        raise ValueError(f"--step={flag}: give the training step of a checkpoint (0 or more), or leave it out for "
                         f"the newest")
    return None if flag == -1 else flag


def load_policy(spec: RunSpec, mesh, what: str = "eval", log=print, adapters: bool = False,
                step: int | None = None) -> tuple[ModelConfig, dict, str, int]:
    """(cfg, params, where they came from, step) for eval, export and serving: the parameters of the
    checkpoint of `step` in out_dir (default: the newest readable one), else the weights at
    model.path (step 0); in the sampler's layout on `mesh`, one copy, no optimiser state. A LoRA run's
    checkpoint holds its adapters: they come back merged into the frozen weights (a model of
    `cfg.base()`), or, with `adapters`, as they are (cfg with LoRA)."""
    from spiral_jax.checkpoint import Checkpointer
    from spiral_jax.models import abstract_params, load_policy_weights
    from spiral_jax.sharding import Rules

    directory = f"{spec.out_dir.rstrip('/')}/checkpoints"
    cfg = spec.model
    if "://" in directory or Path(directory).is_dir():
        ckpt = Checkpointer(directory)
        if ckpt.latest_step() is not None:
            like = abstract_params(cfg, rules=Rules.create(mesh, "sample"))
            params, step, meta = ckpt.restore_params(lora.split(like)[1] if cfg.lora_rank else like, log=log,
                                                     step=step)
            ckpt.close()
            source = f"the checkpoint of step {step} in {ckpt.directory}"
            if cfg.lora_rank:
                check_lora_alpha(meta.get("config"), cfg, source)
                check_lora_base(meta.get("lora_base"), meta.get("lora_base_files"), meta.get("config"), spec, source)
                if adapters:
                    return cfg, params, source, step
                params = lora.merge(lora.join(_base_weights(spec, mesh), params), cfg)
            return cfg.base(), params, source, step
    if step:
        raise FileNotFoundError(f"no checkpoint of step {step} to {what}: no checkpoint in {directory}")
    if adapters:
        raise FileNotFoundError(f"no LoRA adapters to {what}: no checkpoint in {directory}")
    if not spec.model_path:
        raise FileNotFoundError(f"nothing to {what}: no checkpoint in {directory} and no model.path; "
                                f"train first or pass --config.model.path=HF_FOLDER")
    return (cfg.base(), load_policy_weights(spec.model_path, cfg.base(), mesh),
            f"the weights at model.path={spec.model_path}", 0)


def build_tokenizer(spec: RunSpec, cfg: ModelConfig | None = None) -> Tokenizer:
    """The run's tokenizer with its chat template, checked against the model's vocabulary."""
    if not spec.tokenizer_path:
        raise CheckpointError("no tokenizer: set tokenizer.path (a folder, or 'embedded' for the "
                              "project's tiny tokenizer) when model.path is empty")
    return load_tokenizer(spec.tokenizer_path, cfg or spec.model, spec.template, spec.model_path)


def eval_context(spec: RunSpec, cfg: ModelConfig, params, tokenizer, mesh, step: int = 0,
                 sampler: Sampler | None = None, math: bool = False) -> EvalContext:
    """What the evaluation suite needs to evaluate the policy of `step` (`params`, sampler layout on
    `mesh`) as this run does: its settings, sizes and seeds. Without `sampler`, one sized like the
    trainer's is built, with room for eval.math's answers where `math` says so (the bench suite)."""
    e, r = spec.evaluation, spec.rollout
    return EvalContext(cfg, params, tokenizer, sampler or spec.sampler(cfg, mesh, math), e.sampling, e.invalid_rewards,
                       spec.games.max_turns, spec.seed, mesh, r.eval_in_flight, r.schedule, e.math.sampling,
                       spec.api, step=step)
