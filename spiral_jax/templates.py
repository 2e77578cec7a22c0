"""Prompt templates: how a game observation becomes the text the model continues.

- `qwen_raw`: SPIRAL's choice: one raw Qwen chat turn (user: the game instruction, the observation,
  "reason, then box the move"; then an open assistant turn). No system prompt, no thinking toggle, the
  same string for base and instruct models. Wording ours; override it with `instruction`/`suffix`.
- `chat`: the tokenizer's own chat template (any model family), with `enable_thinking` for Qwen3.
- `plain`: plain text for base models without chat tokens, tokenized as a raw prompt (after the
  tokenizer's BOS where it puts one before raw text, as Llama 3's does: `Tokenizer.encode_prompt`).

Generation stops where vLLM would stop it: at the checkpoint's end-of-sequence ids (the tokenizer's
EOS and generation_config.json's), plus the token the template itself closes turns with:
`<|im_end|>` for qwen_raw, the end-of-turn token the tokenizer's chat template writes for chat
(`<|im_end|>`, `<|eot_id|>`, ...), none for plain (spiral_jax/tokenizer.py, `stop_ids_for`).
"""
from __future__ import annotations

import dataclasses

INSTRUCTION = ("You are one of two players in a zero-sum game. Only valid moves count; "
               "play to win.\nHere is what you see:\n")
SUFFIX = ("\n\nThink it through step by step, then write your move inside \\boxed{}.")
TEMPLATES = ("qwen_raw", "chat", "plain")


@dataclasses.dataclass(frozen=True)
class Template:
    name: str = "qwen_raw"
    instruction: str = INSTRUCTION
    suffix: str = SUFFIX
    enable_thinking: bool = False  # only read by `chat`, for tokenizers that support it (Qwen3)

    def __post_init__(self):
        if self.name not in TEMPLATES:
            raise ValueError(f"unknown template {self.name!r}; use one of {', '.join(TEMPLATES)}")

    def user_text(self, observation: str) -> str:
        """The user message of one turn: the instruction, the observation and the suffix."""
        return f"{self.instruction}{observation}{self.suffix}"

    def render(self, observation: str, tokenizer=None) -> str:
        """The prompt text for one turn. `chat` needs the HF tokenizer (for its chat template)."""
        return self.render_chat([{"role": "user", "content": self.user_text(observation)}], tokenizer)

    def render_chat(self, messages, tokenizer=None) -> str:
        """A conversation ([{"role": ..., "content": ...}], the user's turn last) as the prompt text,
        an assistant turn left open: a game turn is one user message (`render`); `spiral-jax serve`
        renders what its clients send."""
        if self.name == "qwen_raw":
            turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            return f"{turns}<|im_start|>assistant\n"
        if self.name == "plain":
            return "\n\n".join(m["content"] for m in messages) + "\n\nAnswer: "
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError("template 'chat' needs a tokenizer with a chat_template; use 'qwen_raw' or "
                             "'plain' for tokenizers without one")
        return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                             enable_thinking=self.enable_thinking)
