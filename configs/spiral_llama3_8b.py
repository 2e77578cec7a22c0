"""SPIRAL on Llama 3.1 8B (beyond the paper): the Kuhn recipe with Llama's own chat template.

Llama has no Qwen chat tokens, so the prompt uses the tokenizer's chat template; stop ids come from
the tokenizer and generation_config.json (<|eot_id|>, <|end_of_text|>). Other settings as the paper's
Kuhn run. 8B needs the weights sharded: fsdp over all devices by default.

    spiral-jax train --config configs/spiral_llama3_8b.py --config.model.path=/ckpt/Llama-3.1-8B-Instruct
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/spiral_llama3_8b"
    c.model.path = "/path/to/Llama-3.1-8B-Instruct"
    c.tokenizer.template = "chat"
    c.optim.micro_batch_size = 4
    return c
