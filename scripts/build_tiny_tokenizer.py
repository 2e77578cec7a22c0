"""Build the small byte-level BPE tokenizer shipped for the embedded tiny model.

The tiny default run must work with nothing downloaded, so the project trains its own tokenizer on
text it generates itself: observations from random games of every registered env, the prompt
templates, and boxed answers. Byte-level BPE means any text still encodes (via single bytes), so the
tokenizer keeps working when game wording changes; rebuild it to keep prompts short.

    python scripts/build_tiny_tokenizer.py   # writes spiral_jax/assets/tiny_tokenizer/
"""
import json
import re
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from spiral_jax.envs import RandomOpponent, make, registered_ids
from spiral_jax.templates import Template

OUT = Path(__file__).resolve().parents[1] / "spiral_jax" / "assets" / "tiny_tokenizer"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 2048
# A minimal Qwen-style chat template, so the `chat` prompt template works with this tokenizer too.
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def corpus(games_per_env: int = 60, seed: int = 0):
    """The training text as BPE sees it in use: split at the special tokens, which are matched before
    BPE runs. No merge may rebuild a special token from its text, or a message that writes
    "<|im_end|>" would end its turn (Tokenizer.chat_prompt_ids)."""
    special = re.compile("|".join(map(re.escape, SPECIAL)))
    for text in _texts(games_per_env, seed):
        yield from filter(None, special.split(text))


def _texts(games_per_env: int, seed: int):
    rng = np.random.default_rng(seed)
    template = Template()
    for env_id in registered_ids():
        for g in range(games_per_env):
            env = make(env_id)
            env.reset(seed=int(rng.integers(1 << 30)))
            opponent = RandomOpponent(seed=g)
            while not env.done:
                yield template.render(env.observation())
                action = opponent.act(env)
                yield f"\\boxed{{{action.strip('[]')}}}<|im_end|>"
                env.step(action)
    for cell in range(9):
        yield f"I take the free cell {cell}. \\boxed{{{cell}}}"


def main():
    tok = Tokenizer(models.BPE())
    # No pre-splitting on spaces: merges may span words, so the constant rules text of each game
    # collapses into a few tokens and prompts stay short (attention cost is quadratic in length).
    # Digits stay single tokens, so a move in the answer is the same token as on the board.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL[1:2])
    fast.chat_template = CHAT_TEMPLATE
    OUT.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(OUT)
    # transformers 5 writes its own names for the class and the extra special tokens, which 4.x cannot
    # read; the names 4.x writes load the same tokenizer in both.
    config_file = OUT / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if "extra_special_tokens" in config:
        config["additional_special_tokens"] = config.pop("extra_special_tokens")
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {OUT} ({len(fast)} tokens)")


if __name__ == "__main__":
    main()
