"""The tests' tiny models: random transformers models covering every architecture option spiral_jax
supports, the tiny spiral_jax model of the tests that need no tokenizer, and the one a run config
builds with the embedded tokenizer. Tests with other sizes say why next to them."""

import jax

from spiral_jax.models import ModelConfig, forward

# The model's logits as one compiled program. Tests whose weights live on the 8-device mesh (a
# Trainer's, a loaded checkpoint's) call this: the plain function run eagerly dispatches every
# primitive as its own 8-device program, slow and reliant on XLA:CPU's per-op rendezvous of 8 device
# threads on 2 cores.
jit_forward = jax.jit(forward, static_argnums=1)

# Qwen3-style (q/k norm, tied embeddings, GQA); every dimension splits over a (2, 2, 2) mesh.
TINY = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, tie_word_embeddings=True)

# `model.random` of the tiny run configs (trainer, CLI, multi-host tests): sized for the embedded
# 2048-token tokenizer, with 512 positions for prompts of up to 256 tokens.
TINY_RUN = dict(vocab_size=2048, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                num_kv_heads=1, head_dim=16, max_position_embeddings=512)

# Each family switches on the options it is meant to exercise.
FAMILIES = {
    # Qwen2: q/k/v bias, GQA, untied.
    "qwen2": dict(cls="Qwen2Config", vocab_size=512, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False),
    # Qwen3: q/k RMSNorm, explicit head_dim != hidden/heads, tied embeddings.
    "qwen3": dict(cls="Qwen3Config", vocab_size=512, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  max_position_embeddings=2048, rope_theta=1000000.0, tie_word_embeddings=True),
    # Llama 3: llama3 rope scaling with a small original max so the scaling changes the result.
    "llama": dict(cls="LlamaConfig", vocab_size=512, hidden_size=64, intermediate_size=96,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                  max_position_embeddings=2048, rope_theta=500000.0, tie_word_embeddings=False,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
}


def make_hf_model(family: str, path=None, seed: int = 0, **overrides):
    """A random fp32 model whose logits are of order 1; saved to `path` when given."""
    import torch  # here, so that the spiral_jax sizes above import without PyTorch
    import transformers

    spec = {**FAMILIES[family], **overrides}
    config = getattr(transformers, spec.pop("cls"))(**spec, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2 if p.ndim == 1 else 0.08)
    if path is not None:
        model.save_pretrained(path)
    return model
