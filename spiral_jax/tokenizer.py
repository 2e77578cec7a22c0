"""The checkpoint's tokenizer (via transformers), its stop ids, and the check that it fits the model."""
from __future__ import annotations

import functools
import itertools
import re
from pathlib import Path

from spiral_jax.models.config import CheckpointError, ModelConfig, read_json_object, token_ids
from spiral_jax.paths import local_folder
from spiral_jax.templates import Template

# A folder holds a tokenizer when it has one of these (fast, slow BPE, or sentencepiece).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
# An observation the chat template must write into the prompt (`check_chat_template`).
_PROBE = "Board: SPIRAL-PROBE-7f3a"
# Tokens that end an assistant turn in the families spiral_jax supports.
_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")
# Characters that may bracket the special-token text of a message while its prompt renders: Unicode's
# private-use areas, which no tokenizer gives a meaning (one the messages do not hold is used).
_PRIVATE_USE = (range(0xE000, 0xF900), range(0xF0000, 0xFFFFE), range(0x100000, 0x10FFFE))


class Tokenizer:
    """Text <-> ids for one model, with the stop ids and prompt template used during play."""

    def __init__(self, hf_tokenizer, template: Template, stop_ids: frozenset[int]):
        self.hf = hf_tokenizer
        self.template = template
        self.stop_ids = stop_ids

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str, bos: bool = False) -> list[int]:
        """`text` as ids, with no special tokens added; `bos` puts the tokenizer's BOS first (`bos_id`),
        unless the text begins with it, as transformers and vLLM tokenize a raw prompt."""
        ids = self.hf.encode(text, add_special_tokens=False)
        if bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids.insert(0, self.bos_id)
        return ids

    @functools.cached_property
    def bos_id(self) -> int | None:
        """The token the tokenizer puts before raw text of its own accord (Llama 3's <|begin_of_text|>);
        None where it puts none (Qwen's)."""
        bos = self.hf.bos_token_id
        return bos if bos is not None and self.hf.encode("a", add_special_tokens=True)[:1] == [bos] else None

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt rendered by the template as ids: a chat rendering holds the BOS its template writes,
        if any; plain text is a raw prompt and gets the tokenizer's BOS (a Llama base model without it
        sees a start it was never trained on)."""
        return self.encode(text, bos=self.template.name == "plain")

    def prompt_ids(self, observation: str) -> list[int]:
        """The prompt of one game turn as ids. The observation is text: a special token's text in it (an
        opponent's chat line reading "<|im_end|>") is spelt in ordinary tokens, so that only the template's
        own special tokens (its instruction's included) are control tokens and no player can end the turn
        or open another in its prompt."""
        return self._spelt(lambda text: self.template.render(text(observation), self.hf), [observation])

    def chat_prompt_ids(self, messages) -> list[int]:
        """A conversation ([{"role", "content"}], the user's turn last) rendered by the template as ids,
        an assistant turn left open. Every message is text, as an observation is in `prompt_ids`: a
        client's message cannot close its turn or open a system one."""
        return self._spelt(lambda text: self.template.render_chat(
            [{**m, "content": text(m["content"])} for m in messages], self.hf), [m["content"] for m in messages])

    def _spelt(self, render, texts: list[str]) -> list[int]:
        """The ids of `render(text)`, a prompt with `texts` written in by `text`, where the special-token
        text of `texts` is tokenized as ordinary text."""
        rendered = render(lambda t: t)
        if not any(self._special_text.search(t) for t in texts):
            return self.encode_prompt(rendered)
        # Bracket each special text in a character the prompt does not hold, then split there: [template
        # and text, special text, template and text, ...]. The text around a special text is tokenized
        # apart from it, as a parsed special token would split it anyway.
        used = set(rendered).union(*texts)
        mark = next((c for c in map(chr, itertools.chain(*_PRIVATE_USE)) if c not in used), None)
        if mark is None:
            raise ValueError("the text holds every private-use character; spiral_jax cannot mark its "
                             "special-token text")
        pieces = render(lambda t: self._special_text.sub(lambda m: f"{mark}{m.group()}{mark}", t)).split(mark)
        if len(pieces) % 2 == 0:
            raise ValueError("the chat template cut a message's text inside a special token's text")
        ids = self.encode_prompt(pieces[0])
        for i, piece in enumerate(pieces[1:], start=1):
            ids += self.hf(piece, add_special_tokens=False, split_special_tokens=True)["input_ids"] if i % 2 \
                else self.encode(piece)
        return ids

    @functools.cached_property
    def _special_text(self) -> re.Pattern:
        """Matches the text of any of the tokenizer's special tokens, longest first."""
        texts = sorted((t.content for t in self.hf.added_tokens_decoder.values() if t.special), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts)) or "(?!)")  # (?!) matches nothing

    @functools.cached_property
    def end_of_turn_id(self) -> int:
        """The token a turn ends with: the one the template closes turns with (`<|im_end|>` for
        qwen_raw, `<|eot_id|>` for Llama 3's chat template), else the tokenizer's EOS, else the first
        end-of-turn token it knows. Imitation targets end with it, and exact scoring of answers appends
        it. A base checkpoint's EOS (`<|endoftext|>`) ends documents, not the template's turns."""
        vocab = self.hf.get_vocab()
        closing = template_end_of_turn(self.hf, self.template)
        if closing:
            return next(vocab[t] for t in _END_OF_TURN if vocab.get(t) in closing)
        if self.hf.eos_token_id is not None:
            return int(self.hf.eos_token_id)
        return next((vocab[t] for t in _END_OF_TURN if t in vocab), min(self.stop_ids))


def template_end_of_turn(hf_tokenizer, template: Template) -> set[int]:
    """The end-of-turn tokens the prompt template itself closes turns with: `<|im_end|>` for qwen_raw,
    whatever the tokenizer's chat template writes after a message for chat, none for plain (a base
    model continues plain text until its own end of sequence)."""
    vocab = hf_tokenizer.get_vocab()
    if template.name == "qwen_raw":
        return {vocab["<|im_end|>"]} if "<|im_end|>" in vocab else set()
    if template.name == "chat" and getattr(hf_tokenizer, "chat_template", None):
        text = hf_tokenizer.apply_chat_template([{"role": "user", "content": "q"},
                                                 {"role": "assistant", "content": "a"}], tokenize=False)
        after = text[text.rindex("a") + 1:] if "a" in text else ""  # a template may leave the reply out
        return {vocab[t] for t in _END_OF_TURN if t in vocab and t in after}
    return set()


def read_generation_config(folder) -> dict:
    """A checkpoint folder's generation_config.json (stop ids, sampling defaults); {} when it has none."""
    file = Path(folder) / "generation_config.json"
    return read_json_object(file) if file.is_file() else {}


def stop_ids_for(hf_tokenizer, path: Path | None = None, template: Template | None = None,
                 model_eos=None) -> frozenset[int]:
    """Where generation stops, as transformers and vLLM decide it: the tokenizer's EOS; the eos ids of
    the model folder `path`'s generation_config.json, or where it has none, of its config.json
    (`model_eos`); and the end-of-turn token of the prompt template (`template_end_of_turn`)."""
    ids = set()
    if hf_tokenizer.eos_token_id is not None:
        ids.add(int(hf_tokenizer.eos_token_id))
    generation = read_generation_config(path) if path is not None else {}
    if "eos_token_id" in generation:
        eos = token_ids(generation, "eos_token_id", where=str(Path(path) / "generation_config.json"))
    else:
        eos = model_eos
    ids.update([eos] if isinstance(eos, int) else (eos or []))
    ids |= template_end_of_turn(hf_tokenizer, template or Template())
    if not ids:
        raise CheckpointError("the tokenizer defines no EOS / end-of-turn token, so generation could "
                              "never stop; add eos_token to tokenizer_config.json")
    return frozenset(ids)


def load_tokenizer(path, cfg: ModelConfig, template: Template | None = None, model_path=None) -> Tokenizer:
    """Load with AutoTokenizer (fast or sentencepiece) and check it against the model's embedding and
    special tokens. Stop ids read the generation_config.json of `model_path` (the model's own, as
    transformers and vLLM do), else of the tokenizer folder (`stop_ids_for`)."""
    from transformers import AutoTokenizer

    path = local_folder(path, "the tokenizer folder (tokenizer.path, else model.path)")
    if not path.is_dir():
        raise CheckpointError(f"tokenizer folder {path} {'is a file' if path.exists() else 'does not exist'}; "
                              f"point tokenizer.path at the folder holding tokenizer.json / tokenizer_config.json")
    if not any((path / name).exists() for name in _TOKENIZER_FILES):
        # transformers would build an empty tokenizer from config.json alone
        raise CheckpointError(
            f"{path} has no tokenizer files ({', '.join(_TOKENIZER_FILES)}); download the model's tokenizer "
            f"with it (hf download fetches both) or point tokenizer.path at the folder that has it")
    try:
        hf = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # noqa: BLE001 (malformed files fail anywhere in transformers or tokenizers)
        raise CheckpointError(f"could not load a tokenizer from {path} ({type(e).__name__}: {e}); its tokenizer "
                              f"files are damaged or incomplete: download the model's tokenizer again") from None
    check_vocabulary(hf, cfg, path)
    template = template or Template()
    check_template_tokens(hf, template, path)
    generation_folder = Path(model_path) if model_path and Path(model_path).is_dir() else path
    return Tokenizer(hf, template, stop_ids_for(hf, generation_folder, template, cfg.eos_token_id))


def check_vocabulary(hf_tokenizer, cfg: ModelConfig, path) -> None:
    """The tokenizer must belong to the model: no more tokens than embedding rows, no id past them (a
    vocabulary may skip ids), not far fewer (checkpoints pad their embedding by a little, never by
    half), and the BOS and EOS ids of the model's config.json must be tokens of it (a Llama 3 tokenizer
    on a Qwen model passes the size checks, but Qwen's <|endoftext|> is id 151643, past its 128256 tokens)."""
    n, rows = len(hf_tokenizer), cfg.vocab_size
    top = max(hf_tokenizer.get_vocab().values(), default=-1)
    fix = "this tokenizer does not belong to this model (point tokenizer.path at the model's own tokenizer)"
    if n > rows:
        raise CheckpointError(f"the tokenizer at {path} has {n} tokens but the model's embedding has only "
                              f"{rows} rows; {fix}")
    if top >= rows:
        raise CheckpointError(f"the tokenizer at {path} has a token of id {top} but the model's embedding has "
                              f"only {rows} rows (ids 0-{rows - 1}); {fix}")
    if n < rows // 2:
        raise CheckpointError(f"the tokenizer at {path} has {n} tokens but the model's embedding has "
                              f"{rows} rows; {fix}")
    eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, tuple) else (cfg.eos_token_id,)
    named = {"bos_token_id": (cfg.bos_token_id,), "eos_token_id": eos}
    for key, ids in named.items():
        outside = [i for i in ids if i is not None and not 0 <= i <= top]
        if outside:
            raise CheckpointError(f"the model's config.json has {key}={outside[0]}, but the tokenizer at "
                                  f"{path} has only {n} tokens (ids 0-{top}); {fix}")


def check_template_tokens(hf_tokenizer, template: Template, path) -> None:
    """The prompt template's special tokens must be single tokens of this tokenizer; otherwise every
    prompt is spelt out in pieces the model never saw, and every move comes out invalid."""
    if template.name == "chat" and not getattr(hf_tokenizer, "chat_template", None):
        raise CheckpointError(f"template 'chat' needs a tokenizer with a chat_template, and the one at "
                              f"{path} has none; use tokenizer.template='qwen_raw' or 'plain'")
    if template.name == "chat":
        check_chat_template(hf_tokenizer, template, path)
    if template.name != "qwen_raw":
        return
    vocab = hf_tokenizer.get_vocab()
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if t not in vocab]
    if missing:
        raise CheckpointError(
            f"template 'qwen_raw' writes {' and '.join(missing)}, which the tokenizer at {path} does not "
            f"have as tokens (not a Qwen tokenizer?); use tokenizer.template='chat' (the tokenizer's own "
            f"chat template) or 'plain', or point tokenizer.path at the model's own tokenizer")


def check_chat_template(hf_tokenizer, template: Template, path) -> None:
    """The tokenizer's chat template must render a game turn with the observation in it: one that
    fails (a Jinja error, raise_exception) would fail at the first prompt, one that leaves the user's
    message out (a template for list-of-parts content) would send the model no observation at all."""
    fix = ("fix chat_template in its tokenizer_config.json or chat_template.jinja, or use tokenizer.template="
           "'qwen_raw' or 'plain'")
    try:
        text = template.render(_PROBE, hf_tokenizer)
        template_end_of_turn(hf_tokenizer, template)
    except Exception as e:  # noqa: BLE001 (Jinja and transformers raise many kinds)
        raise CheckpointError(f"the chat template of the tokenizer at {path} fails on a user message and a reply "
                              f"({type(e).__name__}: {e}); {fix}") from None
    if _PROBE not in text:
        raise CheckpointError(f"the chat template of the tokenizer at {path} does not write the user's message "
                              f"into the prompt, so the model would never see the game; {fix}")
