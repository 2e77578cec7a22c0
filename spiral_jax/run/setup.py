"""What a config builds: the model (with LoRA's adapters), its tokenizer, the optimiser, RAE and
sampling settings, and the policy eval, export and serve load. The one place that turns a
`ConfigDict` into the project's typed objects; `spiral_jax.config` holds the schema itself.
"""
from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
from ml_collections import ConfigDict

from spiral_jax.config import EMBEDDED_TOKENIZER
from spiral_jax.models import CheckpointError, ModelConfig, init_params, load_pretrained, lora
from spiral_jax.rl.rae import RAEConfig
from spiral_jax.rl.train_step import TrainConfig
from spiral_jax.sampling import SamplingParams
from spiral_jax.templates import Template
from spiral_jax.tokenizer import Tokenizer, load_tokenizer


def train_config(optim: ConfigDict, **changes) -> TrainConfig:
    """The optimiser, loss and micro-batching settings (`optim`, with `changes` on top)."""
    fields = {**optim.to_dict(), **changes}
    fields["tis_cap"] = fields["tis_cap"] or None  # 0 = off in config files
    fields["micro_batch_size"] = fields["micro_batch_size"] or None
    return TrainConfig(**fields)


def bootstrap_train_config(c: ConfigDict) -> TrainConfig:
    """The bootstrap's optimiser: `optim` with the bootstrap's learning rate and schedule, plain
    token-mean maximum likelihood (one epoch, no KL penalty or importance weights), micro-batched
    like the RL update."""
    b = c.bootstrap
    return train_config(c.optim, learning_rate=b.learning_rate, normaliser="token_mean", epochs=1,
                        kl_coef=0.0, tis_cap=0.0,
                        warmup_steps=b.warmup_steps, schedule=b.schedule,
                        decay_steps=max(b.steps - b.warmup_steps, 1), final_lr_fraction=0.0)


def rae_config(c: ConfigDict) -> RAEConfig:
    return RAEConfig(c.rae.decay, c.rae.enabled, c.rae.drop_zero, c.rae.games_per_shard)


def rollout_sampling(c: ConfigDict) -> SamplingParams:
    """How training games are sampled."""
    r = c.rollout
    return SamplingParams(r.max_new_tokens, r.temperature, r.top_k, r.top_p)


def eval_sampling(c: ConfigDict) -> SamplingParams:
    """How evaluation games are sampled (no top-k: the reference evaluates with top-p only)."""
    e = c.eval
    return SamplingParams(e.max_new_tokens, e.temperature, 0, e.top_p)


def math_sampling(c: ConfigDict) -> SamplingParams:
    """How math benchmark answers are sampled (top-p only, as the reference)."""
    m = c.eval.math
    return SamplingParams(m.max_new_tokens, m.temperature, 0, m.top_p)


# The reference's offline evaluation settings, for `spiral-jax eval --protocol reference`: games at
# temperature 0.7, top-p 0.9, 8192 new tokens, 512 games; math at temperature 0.6, top-p 0.95, 8192
# new tokens, 4 samples per item, the instruction before the question.


def _runtime(c: ConfigDict) -> dict:
    return dict(compute_dtype=c.model.compute_dtype, scan_layers=c.model.scan_layers, remat=c.model.remat,
                attention=c.model.attention)


def _with_lora(c: ConfigDict, cfg: ModelConfig) -> ModelConfig:
    lora = c.model.lora
    if lora.dropout:
        raise ValueError(f"model.lora.dropout={lora.dropout}: dropout on the adapters is not supported; use 0")
    if lora.sample not in ("merged", "adapters"):
        raise ValueError(f"model.lora.sample={lora.sample!r}; use merged or adapters")
    return cfg.replace(lora_rank=lora.rank, lora_alpha=lora.alpha, lora_targets=tuple(lora.targets))


def model_config(c: ConfigDict) -> ModelConfig:
    """The architecture (model.path's config.json, else model.random), with model.lora's adapters."""
    if c.model.path:
        return _with_lora(c, ModelConfig.from_pretrained(c.model.path, **_runtime(c)))
    return _with_lora(c, ModelConfig(**c.model.random.to_dict(), **_runtime(c)))


def build_model(c: ConfigDict, mesh=None) -> tuple[ModelConfig, dict]:
    """The model to train (train layout): model.path's weights, else a random init of model.random;
    with model.lora, fresh adapters beside them (the weights are the same as without)."""
    if c.model.path:
        cfg, params = load_pretrained(c.model.path, mesh=mesh, **_runtime(c))
        cfg = _with_lora(c, cfg)
    else:
        cfg = model_config(c)
        params = init_params(cfg.base(), jax.random.key(c.seed), mesh=mesh, dtype=jnp.float32)
    if cfg.lora_rank:
        params = lora.join(params, lora.init_adapters(cfg, jax.random.fold_in(jax.random.key(c.seed), 1), mesh))
    return cfg, params


def base_fingerprint(c: ConfigDict) -> str:
    """What identifies the frozen weights LoRA adapters are trained on: a hash of model.path's
    config.json and weight files (their bytes), or the random init's shape and seed."""
    import hashlib

    if not c.model.path:
        return "random:" + hashlib.sha256(json.dumps([c.model.random.to_dict(), c.seed], sort_keys=True)
                                          .encode()).hexdigest()[:16]
    digest = hashlib.sha256()
    folder = Path(c.model.path)
    for f in [folder / "config.json", *sorted(folder.glob("*.safetensors"))]:
        digest.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
    return "sha256:" + digest.hexdigest()[:16]


def _base_weights(c: ConfigDict, cfg: ModelConfig, mesh, rules: str = "sample"):
    """The weights LoRA adapters sit on: model.path's, else the random init (as `build_model`)."""
    from spiral_jax.models import load_policy_weights

    if c.model.path:
        return load_policy_weights(c.model.path, cfg.base(), mesh)
    return init_params(cfg.base(), jax.random.key(c.seed), mesh=mesh, dtype=jnp.float32, rules=rules)


def load_policy(c: ConfigDict, mesh, what: str = "eval", log=print, adapters: bool = False) -> tuple[ModelConfig, dict, str]:
    """(cfg, params, where they came from) for eval, export and serving: the parameters of the newest
    readable checkpoint in out_dir, else the weights at model.path; in the sampler's layout on `mesh`,
    one copy, no optimiser state. A LoRA run's checkpoint holds its adapters: they come back merged
    into the frozen weights (a model of `cfg.base()`), or, with `adapters`, as they are (cfg with LoRA)."""
    from spiral_jax.checkpoint import Checkpointer
    from spiral_jax.models import abstract_params, load_policy_weights
    from spiral_jax.sharding import Rules

    directory = f"{c.out_dir.rstrip('/')}/checkpoints"
    cfg = model_config(c)
    if "://" in directory or Path(directory).is_dir():
        ckpt = Checkpointer(directory)
        if ckpt.latest_step() is not None:
            like = abstract_params(cfg, rules=Rules.create(mesh, "sample"))
            params, step, meta = ckpt.restore_params(lora.split(like)[1] if cfg.lora_rank else like, log=log)
            ckpt.close()
            source = f"the checkpoint of step {step} in {ckpt.directory}"
            if cfg.lora_rank:
                if meta.get("lora_base") != base_fingerprint(c):
                    raise CheckpointError(f"{source} holds LoRA adapters trained on other weights than model.path's "
                                          f"({meta.get('lora_base')} != {base_fingerprint(c)}); give the model.path "
                                          f"and model.lora the run was trained with")
                if adapters:
                    return cfg, params, source
                params = lora.merge(lora.join(_base_weights(c, cfg, mesh), params), cfg)
            return cfg.base(), params, source
    if adapters:
        raise FileNotFoundError(f"no LoRA adapters to {what}: no checkpoint in {directory}")
    if not c.model.path:
        raise FileNotFoundError(f"nothing to {what}: no checkpoint in {directory} and no model.path; "
                                f"train first or pass --config.model.path=HF_FOLDER")
    return cfg.base(), load_policy_weights(c.model.path, cfg.base(), mesh), f"the weights at model.path={c.model.path}"


def build_tokenizer(c: ConfigDict, cfg: ModelConfig) -> Tokenizer:
    t = c.tokenizer
    path = EMBEDDED_TOKENIZER if t.path == "embedded" else (t.path or c.model.path)
    if not path:
        raise CheckpointError("no tokenizer: set tokenizer.path (a folder, or 'embedded' for the "
                              "project's tiny tokenizer) when model.path is empty")
    template = Template(t.template, t.instruction, t.suffix, t.enable_thinking)
    return load_tokenizer(path, cfg, template)
