"""The OpenAI wire format: request bodies in (checked field by field), completions and stream chunks out.

Two endpoints share it: chat completions (`messages`, rendered with the config's prompt template, so
an API player's game turn reaches the model as exactly the prompt the trainer's rollouts give it) and
text completions (`prompt`, tokenized as it is). A field this server does not implement is a 400 that
names it, never ignored: a client that asks for something gets it or hears why not.

Log-probs are the model's own, at temperature 1 over the whole vocabulary (what the trainer calls raw
log-probs), whatever temperature or top-p the tokens were sampled with.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
import uuid

import numpy as np

from spiral_jax.sampling import MIN_TEMPERATURE, SamplingParams

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
_SEED_RANGE = 1 << 63
# Fields a client may send with only their neutral value (what the server does anyway, in its JSON type), or null.
_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "response_format": {"type": "text"}, "echo": False,
            "suffix": "", "parallel_tool_calls": False, "tools": [], "tool_choice": None, "logit_bias": {}}
_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "seed", "stream", "stream_options", "stop",
           "logprobs", "user", *_NEUTRAL}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
TEXT_FIELDS = _COMMON | {"prompt", "best_of"}
CHAT_ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """A request answered with this HTTP status and message (the OpenAI error body)."""

    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def body(self) -> dict:
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"
                }.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


@dataclasses.dataclass(frozen=True)
class Limits:
    """What this server takes: the served model's name and the bounds of one request."""

    model: str
    max_rows: int  # choices per request (n x prompts)
    max_tokens: int  # new tokens per choice
    max_prompt_len: int  # prompt tokens
    chars_per_token: int = 16  # a prompt longer than max_prompt_len x this many characters is refused untokenized


@dataclasses.dataclass
class Ask:
    """One request, checked: what to sample and how to answer."""

    kind: str  # "chat" or "text"
    prompts: list[list[int]]  # token ids; each gets n choices
    n: int
    sampling: SamplingParams
    seed: int | None  # None: the server's own randomness
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: bool
    top_logprobs: int
    id: str = ""
    created: int = 0

    @property
    def rows(self) -> int:
        return len(self.prompts) * self.n


def decode_body(raw: bytes) -> dict:
    """The JSON object of a request body; 400 for anything else (bad UTF-8 or JSON, NaN/Infinity,
    nesting too deep to parse, strings no encoder can write)."""
    def constant(name):
        raise bad(f"the body holds {name}, which is not JSON")

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=constant)
    except ApiError:
        raise
    except UnicodeDecodeError as err:
        raise bad(f"the body is not UTF-8 ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise bad("the body's JSON is nested too deeply") from None
    except ValueError as err:
        raise bad(f"the body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise bad("the body must be a JSON object")
    return body


def _text(value, param: str) -> str:
    if not isinstance(value, str):
        raise bad(f"{param} must be a string, got {type(value).__name__}", param)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{param} holds a lone UTF-16 surrogate, which is not text", param) from None
    return value


def _number(body: dict, key: str, default, kind, low=None, high=None):
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and (
            not math.isfinite(value) or kind is int and value != int(value))):
        raise bad(f"{key} must be a finite {'whole ' if kind is int else ''}number, got {value!r}", key)
    # Bounds before the conversion: an integer past float's range (JSON has no limit) compares exactly.
    if (low is not None and value < low) or (high is not None and value > high):
        raise bad(f"{key} must be between {low} and {high}, got {value!r}", key)
    return kind(value)


def _check_fields(body: dict, allowed: set[str], limits: Limits) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(f"this server does not support the parameter {unknown[0]!r}", unknown[0])
    for key, neutral in _NEUTRAL.items():
        if body.get(key) is not None and not (body[key] == neutral and _kind(body[key]) == _kind(neutral)):
            raise bad(f"this server does not support {key}={body[key]!r} (only {neutral!r})", key)
    if body.get("user") is not None:
        _text(body["user"], "user")
    if body.get("model") is not None and _text(body["model"], "model") != limits.model:
        raise ApiError(404, f"the model {body['model']!r} is not served here; this server has {limits.model!r}",
                       "model")


def _sampling(body: dict, limits: Limits, max_tokens: int, stop_ids) -> SamplingParams:
    temperature = _number(body, "temperature", 1.0, float, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, float, 0.0, 1.0)
    if not np.float32(top_p) > 0:  # the sampler takes it as a float32
        raise bad("top_p must be above 0 (1 keeps the whole distribution)", "top_p")
    if temperature < MIN_TEMPERATURE:  # 0 is what OpenAI clients send for the most likely answer
        return SamplingParams(max_tokens, greedy=True, stop_token_ids=stop_ids)
    return SamplingParams(max_tokens, temperature, 0, top_p, stop_token_ids=stop_ids)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not 1 <= len(stop) <= MAX_STOP_STRINGS:
        raise bad(f"stop must be a string or a list of 1 to {MAX_STOP_STRINGS} strings", "stop")
    stop = tuple(_text(s, "stop") for s in stop)
    if not all(stop):
        raise bad("stop strings must not be empty", "stop")
    return stop


def _kind(value) -> str:
    """The JSON type of a value (True is no number here, as it is to Python)."""
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def _flag(value, param: str) -> bool:
    if value is not None and not isinstance(value, bool):
        raise bad(f"{param} must be true or false, got {value!r}", param)
    return bool(value)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = _flag(body.get("stream"), "stream")
    options = {} if body.get("stream_options") is None else body["stream_options"]
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad("stream_options may hold only include_usage", "stream_options")
    if options and not stream:
        raise bad("stream_options needs stream=true", "stream_options")
    return stream, _flag(options.get("include_usage"), "stream_options.include_usage")


def _check_length(prompt: list[int], limits: Limits) -> list[int]:
    if len(prompt) > limits.max_prompt_len:
        raise bad(f"the prompt is {len(prompt)} tokens; this server takes at most {limits.max_prompt_len}")
    if not prompt:
        raise bad("the prompt is empty")
    return prompt


def _check_chars(texts, limits: Limits) -> None:
    """Refuse a prompt too long to be within the token limit before tokenizing it (a 50 MB message
    would otherwise take minutes and gigabytes to tokenize)."""
    chars = sum(len(t) for t in texts)
    if chars > limits.max_prompt_len * limits.chars_per_token:
        raise bad(f"the prompt is {chars} characters; this server takes at most {limits.max_prompt_len} tokens "
                  f"(at most {limits.max_prompt_len * limits.chars_per_token} characters)")


def _messages(body: dict) -> list[dict]:
    """The conversation as [{"role", "content"}]: text in OpenAI's roles, a developer message read as
    a system one (as OpenAI reads it). A message's other keys are refused unless null or empty (a
    client may send back a reply's message with "tool_calls": null); so are tool messages and
    content parts other than text, which this server does not implement."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {\"role\": ..., \"content\": \"...\"}", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object {{\"role\": ..., \"content\": \"...\"}}, got {type(m).__name__}",
                      where)
        role = m.get("role")
        if role in ("tool", "function"):
            raise bad(f"{where} is a {role} message; this server does not support tool calls", f"{where}.role")
        if role not in CHAT_ROLES:
            raise bad(f"{where}.role must be one of {', '.join(CHAT_ROLES)}, got {role!r}", f"{where}.role")
        extra = sorted(k for k, v in m.items() if k not in ("role", "content") and v not in (None, []))
        if extra:
            raise bad(f"this server does not support {where}.{extra[0]}", f"{where}.{extra[0]}")
        content = _content(m.get("content"), f"{where}.content")
        out.append({"role": "system" if role == "developer" else role, "content": _text(content, f"{where}.content")})
    return out


def _content(content, where: str) -> str:
    """A message's text: a string, or a list of text parts ({"type": "text", "text": ...}, as the
    openai client and LangChain may send it) joined by newlines, as vLLM joins them. Other parts
    (images, audio, files) are refused: this server takes text only."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        got = "an empty list" if content == [] else type(content).__name__
        raise bad(f"{where} must be a string or a list of text parts, got {got}", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
            shown = f"a {kind!r} part" if isinstance(kind, str) else f"{type(part).__name__}"
            raise bad(f"{where}[{j}] must be a text part {{\"type\": \"text\", \"text\": \"...\"}} (this "
                      f"server takes text only), got {shown}", f"{where}[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def parse_chat(body: dict, tokenizer, limits: Limits) -> Ask:
    _check_fields(body, CHAT_FIELDS, limits)
    messages = _messages(body)
    _check_chars([m["content"] for m in messages], limits)
    if body.get("max_tokens") is not None and body.get("max_completion_tokens") is not None:  # null: not given
        raise bad("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
    key = "max_tokens" if body.get("max_completion_tokens") is None else "max_completion_tokens"
    max_tokens = _number(body, key, limits.max_tokens, int, 1, limits.max_tokens)
    logprobs = _flag(body.get("logprobs"), "logprobs")
    top = _number(body, "top_logprobs", 0, int, 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad("top_logprobs needs logprobs=true", "top_logprobs")
    try:
        text = tokenizer.template.render_chat(messages, tokenizer.hf)
    except Exception as err:  # noqa: BLE001 (a template that cannot render these messages)
        raise bad(f"the chat template cannot render these messages: {err}", "messages") from None
    _check_chars([text], limits)  # the template's text around each message counts too (100,000 empty ones)
    try:  # a message's special-token text is spelt in plain tokens: it cannot close its turn or open one
        prompt = _check_length(tokenizer.chat_prompt_ids(messages), limits)
    except ValueError as err:
        raise bad(f"the chat template cannot render these messages: {err}", "messages") from None
    return _ask("chat", body, [prompt], max_tokens, logprobs, top, tokenizer, limits)


def parse_text(body: dict, tokenizer, limits: Limits) -> Ask:
    _check_fields(body, TEXT_FIELDS, limits)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        texts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        texts = prompt
    else:
        raise bad("prompt must be a string or a non-empty list of strings", "prompt")
    texts = [_text(t, "prompt") for t in texts]
    _check_chars(texts, limits)
    max_tokens = _number(body, "max_tokens", 16, int, 1, limits.max_tokens)  # OpenAI's default is 16
    top = _number(body, "logprobs", 0, int, 0, 5)  # the number of alternatives per token
    n = _number(body, "n", 1, int, 1, limits.max_rows)
    if _number(body, "best_of", n, int, 1, limits.max_rows) != n:
        raise bad("best_of other than n is not supported", "best_of")
    # Raw text: the tokenizer's BOS first where it adds one (Llama 3), as vLLM tokenizes a prompt.
    prompts = [_check_length(tokenizer.encode(t, bos=True), limits) for t in texts]
    return _ask("text", body, prompts, max_tokens, "logprobs" in body and body["logprobs"] is not None, top,
                tokenizer, limits)


def _ask(kind, body, prompts, max_tokens, logprobs, top, tokenizer, limits: Limits) -> Ask:
    n = _number(body, "n", 1, int, 1, limits.max_rows)
    if n * len(prompts) > limits.max_rows:
        raise bad(f"{len(prompts)} prompts x n={n} is {n * len(prompts)} answers; this server gives at most "
                  f"{limits.max_rows} per request", "n")
    seed = _number(body, "seed", None, int, -_SEED_RANGE, _SEED_RANGE - 1)
    stream, usage = _stream(body)
    if stream and logprobs:
        raise bad("logprobs with stream=true is not supported; ask without streaming", "logprobs")
    prefix = "chatcmpl" if kind == "chat" else "cmpl"
    return Ask(kind, prompts, n, _sampling(body, limits, max_tokens, tokenizer.stop_ids),
               None if seed is None else seed % (1 << 31), _stop(body), stream, usage, bool(logprobs), top,
               f"{prefix}-{uuid.uuid4().hex[:24]}", int(time.time()))


# ------------------------------------------------------------------------------------------- answers


@dataclasses.dataclass
class Choice:
    """One answer: its text, tokens and raw log-probs (cut at a stop string), and why it ended."""

    index: int
    text: str
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" or "length"
    top: list[list[tuple[int, float]]] | None = None  # per token: the most likely (id, log-prob)


def usage(ask: Ask, choices) -> dict:
    prompt = sum(len(p) for p in ask.prompts)
    used = sum(len(c.tokens) for c in choices)
    return {"prompt_tokens": prompt, "completion_tokens": used, "total_tokens": prompt + used}


def _chat_logprobs(c: Choice, piece) -> dict:
    def entry(token, lp):
        text = piece(token)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = []
    for i, (token, lp) in enumerate(zip(c.tokens, c.logprobs)):
        content.append({**entry(token, lp), "top_logprobs": [entry(t, v) for t, v in (c.top[i] if c.top else [])]})
    return {"content": content, "refusal": None}


def _text_logprobs(c: Choice, piece) -> dict:
    pieces = [piece(t) for t in c.tokens]
    offsets = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces))]
    top = [{piece(t): v for t, v in alts} for alts in c.top] if c.top else [None] * len(pieces)
    return {"tokens": pieces, "token_logprobs": list(c.logprobs), "top_logprobs": top, "text_offset": offsets}


def completion(ask: Ask, choices: list[Choice], model: str, piece) -> dict:
    """The whole answer. piece(token id) -> that token's text (for log-probs)."""
    out = []
    for c in choices:
        if ask.kind == "chat":
            entry = {"index": c.index, "message": {"role": "assistant", "content": c.text},
                     "logprobs": _chat_logprobs(c, piece) if ask.logprobs else None}
        else:
            entry = {"index": c.index, "text": c.text, "logprobs": _text_logprobs(c, piece) if ask.logprobs else None}
        out.append({**entry, "finish_reason": c.finish_reason})
    return {"id": ask.id, "object": "chat.completion" if ask.kind == "chat" else "text_completion",
            "created": ask.created, "model": model, "choices": out, "usage": usage(ask, choices),
            "system_fingerprint": None}


def chunk(ask: Ask, model: str, index: int | None = None, text: str | None = None, finish: str | None = None,
          first: bool = False, totals: dict | None = None) -> dict:
    """One server-sent event of a streamed answer: a choice's new text, its end, or (index None) the
    closing usage chunk."""
    if index is None:
        choices = []
    elif ask.kind == "chat":
        delta = {"role": "assistant", "content": text or ""} if first else {} if text is None else {"content": text}
        choices = [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}]
    body = {"id": ask.id, "object": "chat.completion.chunk" if ask.kind == "chat" else "text_completion",
            "created": ask.created, "model": model, "choices": choices, "system_fingerprint": None}
    if ask.include_usage:
        body["usage"] = totals
    return body
