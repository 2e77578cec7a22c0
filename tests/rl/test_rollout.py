"""Rollout: every game is seeded by its global index, so playing in chunks changes nothing."""
from types import SimpleNamespace

import pytest

from spiral_jax.rollout import Rollout
from spiral_jax.sampling import SamplingParams
from spiral_jax.sampling.stats import DecodeStats
from tests.tiny_models import TINY


def _games(max_in_flight):
    rollout = Rollout(None, SimpleNamespace(stop_ids=frozenset({0})), SamplingParams(8),
                      max_in_flight=max_in_flight)
    env_ids = ["TicTacToe-v0", "KuhnPoker-v1", "Nim-v0"] * 4
    seats = [("random", "scripted"), ("scripted", "random")] * 6
    games = rollout.play(env_ids, seats, {}, seed=7)
    return [(g.record.env_id, g.record.seed, g.seats, tuple(t.action for t in g.record.turns), g.record.rewards)
            for g in games]


def test_chunked_play_equals_all_at_once():
    whole = _games(None)
    assert len(whole) == 12 and len({g[1] for g in whole}) == 12  # distinct seeds per game
    assert _games(5) == whole == _games(1)



@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_game_ids_are_global_across_chunks_and_hosts(schedule, monkeypatch):
    """A record's (and a transcript's) game id is its index among all games, not its slot in a chunk
    or in one host's share; each game keeps its own seats."""
    import spiral_jax.rollout as rollout_module
    from spiral_jax.eval.transcripts import game_record

    env_ids = ["TicTacToe-v0", "Nim-v0", "KuhnPoker-v1", "TicTacToe-v0", "Nim-v0"]
    seats = [("random", "scripted"), ("scripted", "random"), ("random", "random"), ("scripted", "scripted"),
             ("random", "scripted")]

    def play(max_in_flight):
        rollout = Rollout(None, SimpleNamespace(stop_ids=frozenset({0})), SamplingParams(8),
                          max_in_flight=max_in_flight, schedule=schedule)
        return rollout.play(env_ids, seats, {}, seed=0)

    for max_in_flight in (None, 2):
        games = play(max_in_flight)
        assert [game_record(g, ("random",))["game"] for g in games] == [0, 1, 2, 3, 4]
        assert [(g.record.env_id, g.seats) for g in games] == list(zip(env_ids, seats))
    whole = play(None)
    monkeypatch.setattr(rollout_module, "process_slice", lambda n: (2, 5))  # this host's share: 2..4
    for max_in_flight in (None, 2):
        share = play(max_in_flight)
        assert [g.record.game for g in share] == [2, 3, 4]
        assert [(g.record.seed, g.seats, g.record.turns) for g in share] == \
            [(g.record.seed, g.seats, g.record.turns) for g in whole[2:]]

def _first_model_turn(finish_reason):
    """One TicTacToe game whose model seat always answers '\\boxed{4}', stopping or cut at the limit."""
    import numpy as np

    tokenizer = SimpleNamespace(stop_ids=frozenset({0}), prompt_ids=lambda obs: [1, 2, 3],
                                decode=lambda ids: "\\boxed{4}")
    sampler = SimpleNamespace(max_prompt_len=64, generate=lambda params, prompts, sampling, seed, row_ids:
                              SimpleNamespace(tokens=[[5, 6]] * len(prompts),
                                              raw_logprobs=[np.zeros(2)] * len(prompts),
                                              finish_reasons=[finish_reason] * len(prompts),
                                              batch_rows=len(prompts), stats=DecodeStats()))
    game, = Rollout(sampler, tokenizer, SamplingParams(8)).play(["TicTacToe-v0"], [("model", "random")],
                                                                 {"model": None}, seed=0)
    return game


def test_a_response_cut_at_the_token_limit_is_an_invalid_move():
    stopped, cut = _first_model_turn("stop"), _first_model_turn("length")
    assert stopped.record.turns[0].valid and stopped.record.turns[0].action == "[4]"
    assert not cut.record.turns[0].valid and len(cut.record.turns) == 1  # the game ends there
    assert cut.record.rewards == {0: -1.5, 1: 0.5}
    assert cut.model_turns[0].finish_reason == "length" and cut.model_turns[0].response_ids == [5, 6]


def test_chunked_play_with_the_model_seat_equals_all_at_once(tiny_model):
    """With the real tiny model and tokenizer in a seat: a model turn's randomness is keyed by its
    game's global index, so how many games share a sampler call changes no token, no action."""
    import numpy as np

    from spiral_jax.sampling import Sampler

    cfg, params, tokenizer = tiny_model
    sampler = Sampler(cfg, None, max_prompt_len=512, max_cache_len=1024)

    def play(max_in_flight):
        rollout = Rollout(sampler, tokenizer, SamplingParams(8, 1.0), max_in_flight=max_in_flight)
        return rollout.play(["TicTacToe-v0", "KuhnPoker-v1"] * 3, [("model", "random"), ("scripted", "model")] * 3,
                            {"model": params}, seed=11)

    whole, chunked = play(None), play(4)
    assert sum(len(g.model_turns) for g in whole) >= 6
    for a, b in zip(whole, chunked):
        assert [t.action for t in a.record.turns] == [t.action for t in b.record.turns]
        assert [t.response_ids for t in a.model_turns] == [t.response_ids for t in b.model_turns]
        for x, y in zip(a.model_turns, b.model_turns):
            np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)


class _ByteTokenizer:
    """Prompts as bytes (so a game's turns share the observation's head); any response is a move.
    With 8 of 64 tokens stopping a row, responses have very different lengths."""

    stop_ids = frozenset(range(8))

    def prompt_ids(self, observation):
        return [8 + b % 56 for b in observation.encode()]

    def decode(self, ids):
        return "\\boxed{%d}" % (sum(ids) % 9)


@pytest.mark.slow
def test_continuous_schedule_plays_the_rounds_games():
    """Same games, same tokens, log-probs equal to rounding: self-play, scripted seats and a second
    frozen policy, with fewer decode slots than games (games wait for a slot) and with one per game."""
    import jax
    import numpy as np

    from spiral_jax.compilation import compile_count
    from spiral_jax.models import init_params
    from spiral_jax.sampling import Sampler

    cfg = TINY.replace(max_position_embeddings=1024)
    params = {"model": init_params(cfg, jax.random.key(0)), "frozen": init_params(cfg, jax.random.key(1))}
    sampler = Sampler(cfg, max_prompt_len=512, max_cache_len=1024)
    seats = [("model", "model")] * 4 + [("model", "random"), ("random", "model")] * 2 + [("frozen", "model")] * 4

    def play(schedule, slots=None):
        rollout = Rollout(sampler, _ByteTokenizer(), SamplingParams(24, 1.0), schedule=schedule, max_in_flight=slots)
        return rollout.play(["TicTacToe-v0"] * 12, seats, params, seed=3), rollout

    rounds, by_rounds = play("rounds")
    assert sum(len(g.model_turns) for g in rounds) > 30
    for slots in (None, 4):
        games, rollout = play("continuous", slots)
        for a, b in zip(rounds, games):
            assert [t.action for t in a.record.turns] == [t.action for t in b.record.turns]
            assert [(t.policy, t.prompt_ids, t.response_ids) for t in a.model_turns] == \
                [(t.policy, t.prompt_ids, t.response_ids) for t in b.model_turns]
            for x, y in zip(a.model_turns, b.model_turns):
                np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
        assert rollout.stats.generated_tokens == by_rounds.stats.generated_tokens
        assert rollout.stats.decoded_tokens == by_rounds.stats.decoded_tokens
        assert rollout.stats.prefill_saved > 0.3
        assert by_rounds.stats.reused_tokens == 0
    # Four slots for twelve games keep the slots busier than one sampler call per round does.
    assert rollout.stats.slot_utilization > by_rounds.stats.slot_utilization
    before = compile_count()
    assert [g.record.turns for g in play("continuous", 4)[0]] == [g.record.turns for g in games]
    assert compile_count() == before
