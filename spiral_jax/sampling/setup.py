"""`DecodeSetup`: what the sampler's and the decode engine's programs share, and the weights as a decode
step reads them."""
from __future__ import annotations

import dataclasses
import functools
import numbers
from typing import Sequence

import jax
import numpy as np

from spiral_jax.models import cpu
from spiral_jax.models.config import ModelConfig
from spiral_jax.models.params import layout_config, param_shardings
from spiral_jax.models.transformer import casts_weights, decode_weights
from spiral_jax.sharding import Rules, batch_shards

# `platform` keys the trace: `decode_weights` splits stacked layers for a GPU only.
_decode_weights = jax.jit(lambda params, cfg, platform: decode_weights(params, cfg), static_argnums=(1, 2))


# Kept: an engine places its parameters at every call, and the sampler at every generate call.
_shardings = functools.lru_cache(maxsize=None)(param_shardings)


@dataclasses.dataclass(frozen=True)
class DecodeSetup:
    """What every decode program of one model on one mesh shares: the model (without remat), the
    sharding rules (None: one device), the prompt and prompt+generation length limits, the smallest
    prompt and batch buckets, and the parameters' placement. A `Sampler` and every `DecodeEngine` made
    from it decode with the same one."""

    cfg: ModelConfig
    rules: Rules | None
    max_prompt_len: int
    max_cache_len: int
    min_prompt_bucket: int
    min_batch_bucket: int
    params_sharding: object = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def create(cls, cfg: ModelConfig, mesh=None, max_prompt_len: int | None = None,
               max_cache_len: int | None = None, min_prompt_bucket: int = 16,
               min_batch_bucket: int = 1) -> DecodeSetup:
        """The limits default to the model's max_position_embeddings; every data-parallel shard of the
        mesh gets at least one row."""
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"cfg must be a ModelConfig (load_pretrained returns (cfg, params)), got "
                            f"{type(cfg).__name__}")
        for name, value in (("max_prompt_len", max_prompt_len), ("max_cache_len", max_cache_len),
                            ("min_prompt_bucket", min_prompt_bucket), ("min_batch_bucket", min_batch_bucket)):
            if value is not None and not (isinstance(value, numbers.Integral) and not isinstance(value, bool)
                                          and value >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        cfg, rules = cfg.replace(remat=False), Rules.create(mesh, "sample")
        max_cache_len = max_cache_len or cfg.max_position_embeddings
        return cls(cfg, rules, max_prompt_len or max_cache_len, max_cache_len, min_prompt_bucket,
                   max(min_batch_bucket, batch_shards(mesh)), _shardings(cfg, rules) if rules else None)

    def place(self, params):
        """The parameters placed as the decode programs take them (as they are on one device). Their
        layers may be stacked or a per-layer list whatever the model's scan_layers (`decode_weights`
        splits a stack on GPU): the decoder runs both."""
        if self.rules is None:
            return params
        return jax.device_put(params, _shardings(layout_config(self.cfg, params), self.rules))

    def decode_weights(self, params):
        """The parameters placed and cast as a decode step reads them (`transformer.decode_weights`), for
        many decode calls on the same weights (a `DecodeEngine`'s rollout); uncopied where nothing needs
        a cast."""
        placed = self.place(params)
        return _decode_weights(placed, self.cfg, cpu.platform()) if casts_weights(placed, self.cfg) else placed

    def check_prompts(self, prompts: Sequence[Sequence[int]]) -> None:
        """Raise a ValueError naming the first prompt that is empty, too long or outside the vocabulary,
        and a TypeError for prompts that are no lists of int token ids (text, floats, one flat list)."""
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
            raise TypeError(f"prompts must be a list of prompts, each a list of int token ids; got "
                            f"{type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError("generate() needs at least one prompt")
        for i, p in enumerate(prompts):
            if isinstance(p, (str, bytes)) or not hasattr(p, "__len__"):
                raise TypeError(f"prompt {i} is {type(p).__name__}, not a list of int token ids; tokenize text "
                                f"first, and wrap a single prompt in a list: [ids]")
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token "
                                 f"(e.g. the BOS token or a chat template)")
            if len(p) > self.max_prompt_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens, more than max_prompt_len="
                                 f"{self.max_prompt_len}; shorten it or raise max_prompt_len")
            _check_ids(i, p, self.cfg.vocab_size)


def _check_ids(i: int, prompt, vocab_size: int) -> None:
    """Raise for prompt `i` unless it is a flat run of int token ids in [0, vocab_size): the prompt
    block is int32, which would silently take a float's whole part, and JAX's gather clamps an
    out-of-range id to the table's edge, so the model would read the wrong token (usually because the
    tokenizer belongs to another model)."""
    try:
        ids = np.asarray(prompt)
    except ValueError:  # ragged
        ids = np.asarray(prompt, object)
    if ids.dtype == object and ids.ndim == 1 and all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):  # ints past int64
        out = next((t for t in prompt if not 0 <= t < vocab_size), None)
    elif ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise TypeError(f"prompt {i} holds {ids.dtype} values of shape {ids.shape}, not a list of int token "
                        f"ids; pass each prompt as a list of ints from the model's tokenizer")
    else:
        out = None if ids.min() >= 0 and ids.max() < vocab_size else next(
            t for t in ids.tolist() if not 0 <= t < vocab_size)
    if out is not None:
        raise ValueError(f"prompt {i} has token id {out}, outside the model's vocabulary [0, {vocab_size}); "
                         f"check that the tokenizer belongs to this model")
