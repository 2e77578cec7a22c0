"""Trainer-side rules: `\\boxed{}` extraction and strict matching with invalid-move rewards."""
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spiral_jax.envs import (EVAL_INVALID_REWARDS, apply_action, extract_action, make,
                             registered_ids)
from spiral_jax.envs.liars_dice import _BID
from spiral_jax.envs.negotiation import offer_body


@pytest.mark.parametrize("response, action", [
    ("I will bet. \\boxed{[bet]}", "[bet]"),
    ("\\boxed{bet}", "[bet]"),
    ("first \\boxed{[check]} then \\boxed{[bet]}", "[bet]"),  # the last box counts
    ("\\boxed{\\text{[fold]}}", "[fold]"),
    ("\\boxed{\\text{call}}", "[call]"),
    ("\\fbox{[4]}", "[4]"),
    ("\\boxed{[Offer: {1} Wood -> 2 Gold]}", "[Offer: {1} Wood -> 2 Gold]"),  # braces matched
    ("  [3]  ", "[3]"),  # no box: the whole stripped response
    ("center please", "[center please]"),  # short and bracket-free: wrapped
    ("one two three four five six", "one two three four five six"),  # more than 5 words
    ("play \\boxed{4} here \\boxed{unclosed", "play [4] here \\boxed{unclosed"),  # last box unclosed
    ("\\boxed{ [ 4 ]\n }", "[ 4 ]"),
    ("\\boxed{ bet }", "[ bet ]"),
    ("a\n\tb", "[a b]"),
    ("", ""),
    ("\\boxed{}", "[]"),
])
def test_extract_action(response, action):
    assert extract_action(response) == action


@given(st.text())
@settings(max_examples=2000, deadline=None)
def test_extract_action_never_raises(text):
    assert isinstance(extract_action(text), str)


_BOXISH = st.lists(st.sampled_from(["\\boxed{", "\\fbox{", "\\text{", "{", "}", "[", "]", "[bet]",
                                    "[4]", " ", "\n", "x"]), max_size=30).map("".join)


@given(st.one_of(st.text(), _BOXISH))
@settings(max_examples=2000, deadline=None)
def test_extract_action_never_raises_on_brace_soup(text):
    assert isinstance(extract_action(text), str)


@given(st.sampled_from(registered_ids()), st.one_of(st.text(max_size=200), _BOXISH), st.integers(0, 3))
@settings(max_examples=500, deadline=None)
def test_apply_action_never_raises(env_id, text, seed):
    for mode in ("strict", "env"):
        env = make(env_id)
        env.reset(seed)
        result = apply_action(env, text, mode)
        assert isinstance(result.info["action"], str)
        assert isinstance(result.info["valid"], bool)


def test_strict_invalid_move_ends_game_with_training_rewards():
    env = make("TicTacToe-v0")
    env.reset(0)
    apply_action(env, "\\boxed{4}")
    result = apply_action(env, "I take the centre: \\boxed{4}")  # occupied now: not a legal action
    assert result.done and not result.info["valid"] and result.info["action"] == "[4]"
    assert result.rewards == {1: -1.5, 0: 0.5} == env.rewards
    with pytest.raises(RuntimeError):
        env.step("[0]")


def test_strict_is_case_sensitive_and_eval_rewards_configurable():
    env = make("KuhnPoker-v1")
    env.reset(0)
    player = env.current_player()
    result = apply_action(env, "\\boxed{[CHECK]}", invalid_rewards=EVAL_INVALID_REWARDS)
    assert result.done and result.rewards == {player: -1.0, 1 - player: 1.0}


def test_strict_legal_move_steps_the_env():
    env = make("KuhnPoker-v1")
    env.reset(0)
    player = env.current_player()
    result = apply_action(env, "Reasoning... so \\boxed{check}")
    assert result.info == {"valid": True, "action": "[check]"} and not result.done
    echo = env.messages(env.current_player())[-2]  # the opponent is shown only the extracted action
    assert (echo.sender, echo.kind, echo.data) == (player, "action", ("[check]",))


def test_env_mode_uses_the_env_rules_and_retries():
    env = make("KuhnPoker-v1", error_allowance=1)
    env.reset(0)
    player = env.current_player()
    result = apply_action(env, "I think I should [Check] \\boxed{}", mode="env")  # "[]" is not a move
    assert not result.info["valid"] and not result.done and env.current_player() == player
    result = apply_action(env, "\\boxed{I think I should [CHECK]}", mode="env")  # decorated: accepted
    assert result.info["valid"]
    with pytest.raises(ValueError):
        apply_action(env, "[bet]", mode="lenient")


def test_env_mode_reads_numbers_with_leading_zeros_as_the_reference_does():
    env = make("TicTacToe-v0")
    env.reset(0)
    zeros = "0" * 30  # past the 18 digits a number may have
    assert apply_action(env, f"[{zeros}4]", mode="env").info["valid"] and env.state()["board"][1][1] == "O"
    assert not apply_action(env, f"[{zeros}4]", mode="env").info["valid"]  # occupied, as [4] would be
    env.reset(0)
    assert not apply_action(env, "[" + "9" * 30 + "]", mode="env").info["valid"]  # no such cell
    assert ("invalid", (0, "range")) in [(m.kind, m.data) for m in env.messages(0)]


@pytest.mark.parametrize("env_id, move, state", [
    ("TicTacToe-v0", "[{z}4]", ("board", [["", "", ""], ["", "O", ""], ["", "", ""]])),
    ("Nim-v0", "[{z}1 {z}2]", ("piles", [3, 2, 5])),
    ("ConnectFour-v0", "[col {z}6]", ("board", [["."] * 7] * 5 + [["."] * 6 + ["X"]])),
    ("LiarsDice-v1", "[Bid: {z}3, {z}4]", ("bid", [3, 4])),
])
def test_leading_zeros_of_any_script_read_as_int_reads_them(env_id, move, state):
    """`\\d` matches the digits of every script and int() reads them: past 18 digits, "٠" and "０"
    are leading zeros as "0" is."""
    for zero in ("0", "\u0660", "\uff10"):
        env = make(env_id)
        env.reset(0)
        text = move.format(z=zero * 30)
        assert int(re.search(r"\d+", text).group()) < 10  # the reference reads a small number
        assert env.step(text).info["valid"], (env_id, zero)
        assert env.state()[state[0]] == state[1]


# The reference's offer pattern, the oracle for `offer_body`.
_REFERENCE_OFFER = re.compile(r"\[Offer:\s*(?:I\s+(?:give|offer)\s+)?([^\[\]]+?)\s*\.*\]", re.IGNORECASE)
_OFFERISH = st.builds(
    str.__add__, st.sampled_from(["", "[Offer:", "chat [offer:"]),
    st.lists(st.sampled_from(["[Offer:", "[", "]", " ", "  ", "\t", "\n", "\xa0", ".", "..", "I", " give", "OFFER",
                              " offer ", "I give ", "3 Wood", "->", "2 Gold", ",", "x"]), max_size=12).map("".join))


@given(_OFFERISH)
@settings(max_examples=3000, deadline=None)
def test_offer_bodies_are_what_the_reference_pattern_reads(text):
    match = _REFERENCE_OFFER.search(text)
    assert offer_body(text) == (match.group(1) if match else None)


def test_long_hostile_responses_are_read_in_linear_time():
    """Unclosed boxes, and offers whose "]" never comes after a long run of spaces or dots: patterns
    that backtrack over them took a minute at these lengths (time quadratic in the length)."""
    start = time.perf_counter()
    boxes = "\\boxed{" * 50_000
    assert extract_action(boxes) == f"[{boxes}]"
    for tail in (" " * 50_000, "." * 50_000, " " * 50_000 + "x]"):
        env = make("SimpleNegotiation-v1")
        env.reset(0)
        result = apply_action(env, "[Offer: 1 Wood" + tail, mode="env")
        assert result.info["valid"] == (tail[-1] != "]")  # no "]": chat; "1 Wood ... x": unreadable
    assert time.perf_counter() - start < 2.0


_REFERENCE_BID = re.compile(r"\[bid\s*:?\s*(\d+)[,\s]+(\d+)\]", re.IGNORECASE)
_BIDDISH = st.lists(st.sampled_from(["[bid", "[Bid:", "BID", "[", "]", ":", " ", "  ", "\t", "\n", "\u3000", ",",
                                     "1", "23", "\u0664", "x"]), max_size=12).map("".join)


@given(_BIDDISH)
@settings(max_examples=3000, deadline=None)
def test_bids_are_read_as_the_reference_pattern_reads_them(text):
    match, reference = _BID.search(text), _REFERENCE_BID.search(text)
    assert (match and (match.span(), match.groups())) == (reference and (reference.span(), reference.groups()))


def test_a_long_run_of_whitespace_after_bid_is_read_in_linear_time():
    """A pattern with two `\\s*` in a row splits a run of whitespace after "[bid" in every possible way:
    20,000 spaces take seconds."""
    env = make("LiarsDice-v1")
    env.reset(0)
    start = time.perf_counter()
    for tail, valid in (("", False), ("x]", False), ("1]", False), ("1 2]", True)):
        assert env.step("[bid" + " " * 20_000 + tail).info["valid"] == valid
        env.reset(0)
    assert time.perf_counter() - start < 1.0


def test_offer_with_a_long_run_of_punctuation_is_read_in_linear_time():
    """Trailing punctuation matched with `[.,!?]+$` is scanned from every position of a run that
    does not end the offer: 20,000 dots take over a second."""
    start = time.perf_counter()
    for run, tail, valid in (("." * 20_000, "x]", False), ("," * 20_000, " 1]", False),
                             (".,!?" * 5_000, "]", False), ("." * 20_000, " -> 1 Gold]", False)):
        env = make("SimpleNegotiation-v1")
        env.reset(0)
        assert apply_action(env, "[Offer: 1 Wood" + run + tail, mode="env").info["valid"] == valid
    env.reset(0)
    assert apply_action(env, "[Offer: 1 Wood -> 1 Gold" + "." * 20_000 + "]", mode="env").info["valid"]
    assert env.state()["offer"]["requested"] == (("Gold", 1),)
    assert time.perf_counter() - start < 1.0
