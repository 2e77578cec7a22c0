"""The architectures of the Qwen3 base models, as `model.random` fields.

For runs, plans and benchmarks at a real model's size with random weights, with nothing downloaded:
the one-GPU presets take their model's shape from here, and `bench/rl_step.py` its shapes. A run
with `model.path` set reads the checkpoint's own config.json instead. The values are those of each
model's config.json on the Hugging Face Hub (Qwen/Qwen3-0.6B-Base, -1.7B-Base, -4B-Base, -8B-Base).
"""
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, num_kv_heads=8, head_dim=128, tie_word_embeddings=True,
              max_position_embeddings=40960, rope_theta=1000000.0)

QWEN3 = {
    "0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16),
    "1.7b": dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_layers=28, num_heads=16),
    "4b": dict(_QWEN3, hidden_size=2560, intermediate_size=9728, num_layers=36, num_heads=32),
    "8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
               tie_word_embeddings=False, max_position_embeddings=32768),
}
