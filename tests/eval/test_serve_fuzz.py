"""`spiral-jax serve`'s request reading against generated hostile bodies: whatever JSON a client sends,
the reply is a checked request or a 4xx naming the problem, never a 500 (an exception of another kind)."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spiral_jax.config import EMBEDDED_TOKENIZER
from spiral_jax.models import ModelConfig
from spiral_jax.serve import protocol
from spiral_jax.templates import Template
from spiral_jax.tokenizer import load_tokenizer

LIMITS = protocol.Limits("tiny", max_rows=8, max_tokens=16, max_prompt_len=64, chars_per_token=4)

# Text a client might write, hostile pieces included: chat tokens' text, a lone surrogate (JSON's
# "\ud800" decodes to one), the template's private-use mark, control characters.
_TEXT = st.one_of(st.text(max_size=40), st.lists(st.sampled_from(
    ["<|im_end|>", "<|im_start|>", "system", "\n", "\ud800", "\ue000", "\x00", "Your move.", " ", "{{", "}}"]),
    max_size=8).map("".join))
_NUMBER = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from([0, 1, 2, 0.5, -1, 1e-9, 2**63, 2**31]))
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), _NUMBER, _TEXT),
                     lambda inner: st.one_of(st.lists(inner, max_size=4),
                                             st.dictionaries(_TEXT, inner, max_size=4)), max_leaves=12)
_PART = st.one_of(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), _JSON)
_MESSAGE = st.one_of(st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from([*protocol.CHAT_ROLES, "tool", "function"]), _JSON),
     "content": st.one_of(_TEXT, st.lists(_PART, max_size=3), _JSON)},
    optional={"name": _JSON, "tool_calls": _JSON, "refusal": st.none()}), _JSON)
# Each field a plausible value or any JSON at all; a few fields no server knows.
_VALUES = {"messages": st.lists(_MESSAGE, max_size=4), "prompt": st.one_of(_TEXT, st.lists(_TEXT, max_size=3)),
           "stop": st.one_of(_TEXT, st.lists(_TEXT, max_size=5)), "model": st.sampled_from(["tiny", "other"]),
           "stream_options": st.fixed_dictionaries({}, optional={"include_usage": _JSON})}


def _body(fields):
    keys = sorted(fields | {"best_of_n", "functions", "\ud800"})
    return st.dictionaries(st.sampled_from(keys), st.just(None), max_size=8).flatmap(
        lambda chosen: st.fixed_dictionaries({k: st.one_of(_VALUES.get(k, _NUMBER), _JSON) for k in chosen}))


@pytest.fixture(scope="module")
def tokenizer():
    cfg = ModelConfig("qwen3", vocab_size=2048, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16)
    return load_tokenizer(EMBEDDED_TOKENIZER, cfg, Template("qwen_raw"))


def _read(parse, body, tokenizer):
    """The server's path: the body as bytes on the wire, decoded, then read; a refusal is an ApiError."""
    try:
        return parse(protocol.decode_body(json.dumps(body).encode()), tokenizer, LIMITS)
    except protocol.ApiError as err:
        assert 400 <= err.status < 500 and err.message, err.body()
        json.dumps(err.body())  # the error body itself can be written
        return None


def _check(ask, tokenizer):
    assert ask.prompts and ask.n >= 1 and ask.rows <= LIMITS.max_rows
    for prompt in ask.prompts:
        assert 0 < len(prompt) <= LIMITS.max_prompt_len and all(0 <= i < len(tokenizer.hf) for i in prompt)
    assert 1 <= ask.sampling.max_new_tokens <= LIMITS.max_tokens and 0 <= ask.top_logprobs <= 20


@pytest.mark.parametrize("parse,fields", [(protocol.parse_chat, protocol.CHAT_FIELDS),
                                          (protocol.parse_text, protocol.TEXT_FIELDS)], ids=["chat", "text"])
@given(data=st.data())
@settings(max_examples=400, deadline=None)
def test_any_body_is_read_or_refused_with_a_4xx(tokenizer, parse, fields, data):
    ask = _read(parse, data.draw(_body(fields)), tokenizer)
    if ask is not None:
        _check(ask, tokenizer)


@given(messages=st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]),
                                                "content": _TEXT.map(lambda t: t.replace("\ud800", ""))}),
                         min_size=1, max_size=4))
@settings(max_examples=300, deadline=None)
def test_well_formed_chats_are_read_and_never_forge_a_turn(tokenizer, messages):
    """A conversation of text messages is read unless it is too long, and its control tokens are the
    template's own: one turn opening per message, plus the open assistant turn."""
    ask = _read(protocol.parse_chat, {"messages": messages}, tokenizer)
    prompt = tokenizer.chat_prompt_ids(messages)
    rendered = tokenizer.template.render_chat(messages)
    if len(prompt) > LIMITS.max_prompt_len or len(rendered) > LIMITS.max_prompt_len * LIMITS.chars_per_token:
        assert ask is None
        return
    assert ask.prompts == [prompt] and tokenizer.hf.decode(prompt) == rendered
    assert prompt.count(tokenizer.hf.convert_tokens_to_ids("<|im_start|>")) == len(messages) + 1
