"""The optional TextArena adapter (runs only where the `textarena` extra is installed)."""
import importlib.util
import random
import re

import numpy as np
import pytest

from spiral_jax.envs import apply_action, make

HAS_TEXTARENA = importlib.util.find_spec("textarena") is not None
needs_textarena = pytest.mark.skipif(not HAS_TEXTARENA, reason="textarena is not installed "
                                     "(pip install spiral-jax[textarena])")


def test_missing_textarena_says_how_to_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "textarena", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install spiral-jax\[textarena\]"):
        make("textarena:TicTacToe-v0")


@needs_textarena
def test_textarena_game_through_our_protocol():
    env = make("textarena:TicTacToe-v0", error_allowance=0)
    env.reset(seed=0)
    assert env.current_player() == 0 and env.observation() and env.legal_actions() == []
    for cell in ("[0]", "[3]", "[1]", "[4]"):
        assert apply_action(env, f"\\boxed{{{cell}}}", mode="env").info["valid"]
    result = apply_action(env, "\\boxed{[2]}", mode="env")
    assert result.done and result.rewards[0] > result.rewards[1]


@needs_textarena
def test_textarena_invalid_move_is_reported():
    env = make("textarena:TicTacToe-v0", error_allowance=0)
    env.reset(seed=0)
    result = env.step("no move here")
    assert result.done and not result.info["valid"] and result.rewards[0] < result.rewards[1]


@needs_textarena
@pytest.mark.parametrize("seed", range(12))
def test_native_tictactoe_agrees_with_textarena(seed):
    """A/B: the same moves (legal, sometimes an occupied cell) give the same validity and end; the same
    rewards, except that after an invalid move TextArena 0.7 gives the other player +1 where the
    reference (0.6.4 + SPIRAL, which the native game follows, see GAMES.md) gives 0."""
    import numpy as np

    rng = np.random.default_rng(seed)
    native, ours_ta = make("TicTacToe-v0", error_allowance=0), make("textarena:TicTacToe-v0", error_allowance=0)
    native.reset(seed=seed)
    ours_ta.reset(seed=seed)
    played = []
    while not native.done:
        legal = native.legal_actions()
        move = played[0] if played and rng.random() < 0.15 else legal[int(rng.integers(len(legal)))]
        played.append(move)
        a, b = native.step(move), ours_ta.step(move)
        assert (a.done, a.info["valid"]) == (b.done, b.info["valid"]), (played, a, b)
        assert native.current_player() == ours_ta.current_player() or a.done
    if a.info["valid"]:
        assert native.rewards == ours_ta.rewards, played
    else:
        offender = native.current_player()
        assert native.rewards[offender] == ours_ta.rewards[offender] == -1, played


class _FakeState:
    def __init__(self):
        self.observations = {0: [(-1, "rules for 0")], 1: [(-1, "rules for 1")]}
        self.current_player_id, self.turn, self.error_count, self.error_allowance = 0, 0, 0, 1
        self.game_state = {"moves": 0}


class _FakeTextArenaEnv:
    """Just enough of TextArena's env interface: four valid moves end the game, player 0 wins."""

    def reset(self, num_players, seed=None):
        assert num_players == 2
        self.state = _FakeState()

    def get_observation(self):
        pid = self.state.current_player_id
        pending, self.state.observations[pid] = self.state.observations[pid], []
        return pid, pending

    def step(self, action):
        state, pid = self.state, self.state.current_player_id
        for other in (0, 1):
            state.observations[other].append((pid, action))
        if action != "[x]":
            if state.error_count < state.error_allowance:
                state.error_count += 1
                return False, {}
            self.rewards = {pid: -1, 1 - pid: 0}
            return True, {"reason": "Invalid Move: not [x]"}
        state.game_state["moves"] += 1
        state.turn, state.error_count, state.current_player_id = state.turn + 1, 0, 1 - pid
        if state.game_state["moves"] == 4:
            self.rewards = {0: 1, 1: -1}
            return True, {"reason": "four moves"}
        return False, {}

    def close(self):
        return self.rewards, {}


class _Wrapper:
    def __init__(self, env):
        self.env = env


def test_adapter_logic_with_a_stand_in_module(monkeypatch):
    """Exercise the adapter without TextArena: a stand-in module with TextArena's interface."""
    fake = type("textarena", (), {"make": staticmethod(lambda env_id, **kw: _Wrapper(_FakeTextArenaEnv()))})
    monkeypatch.setitem(__import__("sys").modules, "textarena", fake)
    env = make("textarena:Fake-v0", error_allowance=1)
    env.reset(seed=0)
    assert env.env_id == "textarena:Fake-v0" and env.observation(1).startswith("rules for 1")
    result = apply_action(env, "\\boxed{y}", mode="env")
    assert not result.info["valid"] and not result.done and env.error_count == 1
    for _ in range(4):
        result = apply_action(env, "\\boxed{x}", mode="env")
        assert result.info["valid"]
    assert result.done and result.rewards == {0: 1, 1: -1} and env.reason == "four moves"
    assert "[Player 0] [y]" in env.observation(1) and env.state()["game_state"] == {"moves": 4}
    with pytest.raises(ValueError, match="chance"):
        env.reset(seed=0, chance={"deal": [(0, 1)]})


class _DealingTextArenaEnv(_FakeTextArenaEnv):
    """Draws chance as TextArena's games do: its reset re-seeds Python's global `random`, and each
    move deals from `random` and `np.random`, telling both players what was dealt."""

    def reset(self, num_players, seed=None):
        super().reset(num_players, seed)
        random.seed(seed)

    def step(self, action):
        deal = f"dealt {random.randrange(10**9)} {np.random.randint(10**9)}"
        for other in (0, 1):
            self.state.observations[other].append((-1, deal))
        return super().step(action)


def _deals(env):
    return [m.text for m in env.messages(0) if m.text.startswith("dealt")]


def _play_side_by_side(envs, seeds):
    for env, seed in zip(envs, seeds):
        env.reset(seed=seed)
    while not envs[0].done:
        for env in envs:
            if not env.done:
                env.step("[x]")
    return _deals(envs[0])


def test_a_textarena_games_chance_is_its_own(monkeypatch):
    """A game's deals depend only on its seed and moves, not on other TextArena games stepped beside
    it, and playing leaves the caller's global generators as they were."""
    fake = type("textarena", (), {"make": staticmethod(lambda env_id, **kw: _DealingTextArenaEnv())})
    monkeypatch.setitem(__import__("sys").modules, "textarena", fake)
    alone = _play_side_by_side([make("textarena:Fake-v0")], [5])
    assert len(alone) == 4 and len(set(alone)) == 4
    beside = _play_side_by_side([make("textarena:Fake-v0") for _ in range(3)], [5, 6, 5])
    assert beside == alone
    random.seed(1)
    np.random.seed(1)
    expected = random.random(), np.random.random()
    random.seed(1)
    np.random.seed(1)
    env = make("textarena:Fake-v0")
    env.reset(seed=3)
    env.step("[x]")
    assert (random.random(), np.random.random()) == expected


@needs_textarena
def test_textarena_kuhn_poker_deals_alike_alone_and_in_a_batch():
    """KuhnPoker re-deals every round from the `random` that TextArena's reset seeds."""
    from spiral_jax.envs import BatchRunner

    def cards(n_games):
        runner = BatchRunner([make("textarena:KuhnPoker-v0-long") for _ in range(n_games)], seed=5,
                             auto_reset=False)
        while runner.pending():
            runner.submit({q.game: "\\boxed{[Check]}" for q in runner.pending()})
        return re.findall(r"Your card is: '(\w)'", "\n".join(m.text for m in runner.envs[0].messages(0)))

    alone = cards(1)
    assert len(alone) > 5 and cards(3) == alone
    state = random.getstate()
    env = make("textarena:KuhnPoker-v0")
    env.reset(seed=2)
    env.step("[Check]")
    assert random.getstate() == state


@needs_textarena
def test_a_misspelt_textarena_id_fails_at_make():
    with pytest.raises(ValueError, match="unknown TextArena env id 'TicTacToe-v9'; did you mean TicTacToe-v0"):
        make("textarena:TicTacToe-v9")


@needs_textarena
def test_batch_runner_lets_textarena_judge_its_moves():
    """Strict mode needs a list of legal moves; TextArena has none, so its own rules decide."""
    from spiral_jax.envs import BatchRunner

    runner = BatchRunner([make("textarena:TicTacToe-v0")], seed=0, auto_reset=False)  # strict by default
    assert runner.pending()[0].legal_actions == []
    finished = runner.submit({0: "\\boxed{[4]}"})
    assert not finished and runner.pending()  # the move was accepted; the other player is to move


@needs_textarena
def test_random_opponent_on_textarena_is_a_clear_error():
    from spiral_jax.envs import RandomOpponent

    env = make("textarena:TicTacToe-v0")
    env.reset(0)
    with pytest.raises(ValueError, match="needs a game that lists its legal moves"):
        RandomOpponent(0).act(env)


@needs_textarena
@pytest.mark.parametrize("allowance", [0, 1])
def test_a_move_textarena_raises_on_is_an_invalid_move(allowance):
    """TextArena's TicTacToe reads the cell with int(), which refuses more than 4,300 digits."""
    env = make("textarena:TicTacToe-v0", error_allowance=allowance)
    env.reset(seed=0)
    result = env.step("[1" + "0" * 5000 + "]")
    assert not result.info["valid"] and result.done == (allowance == 0) and env.current_player() == 0
    if allowance == 0:
        assert result.rewards == {0: -1, 1: 0}
        return
    assert env.error_count == 1 and "could not read the move" in env.observation(0)
    assert env.step("[4]").info["valid"] and env.current_player() == 1 and env.error_count == 0


class _RaisingTextArenaEnv(_FakeTextArenaEnv):
    def step(self, action):
        if action == "[boom]":
            self.state.observations[0].append((self.state.current_player_id, action))
            raise ValueError("cannot read that")
        return super().step(action)


def test_a_move_textarena_raises_on_counts_against_the_allowance(monkeypatch):
    fake = type("textarena", (), {"make": staticmethod(lambda env_id, **kw: _RaisingTextArenaEnv())})
    monkeypatch.setitem(__import__("sys").modules, "textarena", fake)
    env = make("textarena:Fake-v0", error_allowance=1)
    env.reset(seed=0)
    result = apply_action(env, "\\boxed{boom}", mode="env")
    assert not result.info["valid"] and not result.done and env.error_count == env._ta.state.error_count == 1
    assert "ValueError: cannot read that" in env.observation(0)
    result = apply_action(env, "\\boxed{y}", mode="env")  # TextArena's own invalid move: the allowance is used up
    assert result.done and not result.info["valid"] and result.rewards == {0: -1, 1: 0}
