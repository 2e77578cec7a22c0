"""Pure-JAX Qwen2/2.5, Qwen3 and Llama 3.x decoders with Hugging Face checkpoint I/O."""
from spiral_jax.models import lora
from spiral_jax.models.config import SUPPORTED_MODEL_TYPES, CheckpointError, ModelConfig, RopeScaling
from spiral_jax.models.hf_io import load_policy_weights, load_pretrained, save_adapter, save_pretrained
from spiral_jax.models.params import abstract_params, check_params, init_params, param_shardings, param_specs
from spiral_jax.models.transformer import KVCache, decoder, forward, positions_from_mask, unembed

__all__ = [
    "SUPPORTED_MODEL_TYPES", "CheckpointError", "ModelConfig", "RopeScaling", "load_policy_weights", "load_pretrained",
    "save_adapter", "save_pretrained", "abstract_params", "check_params", "init_params", "param_shardings", "param_specs",
    "KVCache", "decoder", "forward", "positions_from_mask", "unembed", "lora",
]
