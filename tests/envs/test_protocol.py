"""The env protocol: registry, seeding, chance injection, error allowance, turn limits, observations."""
import numpy as np
import pytest

from spiral_jax.envs import GAME, Env, RandomOpponent, make, registered_ids

REQUIRED_IDS = {"TicTacToe-v0", "KuhnPoker-v1", "KuhnPoker-v2", "SimpleNegotiation-v1", "PigDice-v1",
                "LiarsDice-v1", "Snake-v0", "ConnectFour-v0", "Nim-v0", "SimpleTak-v0", "KuhnPokerChips-v0", "PigDiceState-v1"}
DEFAULT_STYLES = {"TicTacToe-v0": "first_last", "KuhnPoker-v1": "full_history",
                  "SimpleNegotiation-v1": "full_history", "PigDice-v1": "full_history"}


def _play_out(env: Env, seed: int) -> list[str]:
    """Random legal play; the actions taken."""
    opponent, actions = RandomOpponent(seed), []
    while not env.done:
        actions.append(opponent.act(env))
        env.step(actions[-1])
    return actions


def test_registry_ids_and_errors():
    assert set(registered_ids()) == REQUIRED_IDS
    with pytest.raises(ValueError, match=r"'Chess-v0'.*TicTacToe-v0.*KuhnPoker-v1"):
        make("Chess-v0")
    with pytest.raises(ValueError, match=r"KuhnPoker-v2 has no setting\(s\) roundz.*rounds"):
        make("KuhnPoker-v2", roundz=1)
    with pytest.raises(ValueError, match="observation_style"):
        make("Nim-v0", observation_style="latest")
    assert make("KuhnPoker-v2", rounds=1).rounds == 1


@pytest.mark.parametrize("env_id, overrides, match", [
    ("KuhnPoker-v1", dict(rounds=2.5), "rounds must be an int like its default 5, got 2.5"),
    ("KuhnPoker-v1", dict(rounds="5"), "rounds must be an int"),
    ("KuhnPoker-v1", dict(fixed_pot="no"), "fixed_pot must be True or False like its default True, got 'no'"),
    ("KuhnPoker-v1", dict(first_opener=True), "first_opener must be an int"),
    ("TicTacToe-v0", dict(error_allowance=True), "error_allowance must be an int"),
    ("Nim-v0", dict(piles=5), r"piles must be a tuple like its default \(3, 4, 5\), got 5"),
    ("SimpleNegotiation-v1", dict(offer_cap=2.5), "offer_cap must be an int"),
    ("SimpleTak-v0", dict(win_check=None), "win_check must be a string"),
    ("Snake-v0", dict(width=2.5), "width must be an int"),
])
def test_an_override_of_another_kind_is_named(env_id, overrides, match):
    """These played a game nobody asked for (2.5 rounds, fixed_pot="no" as true, a bool as a count) or
    failed deep inside the game's first move."""
    with pytest.raises(TypeError, match=f"{env_id}: {match}"):
        make(env_id, **overrides)


def test_settings_out_of_range_and_ids_of_the_wrong_kind_are_named():
    """A grid of no rows failed with an IndexError at the first legal_actions(), negative sizes deep in
    Snake's placement; a non-string id with an AttributeError."""
    with pytest.raises(TypeError, match="env_id must be a string"):
        make(None)
    with pytest.raises(ValueError, match="at least 1 row and column"):
        make("ConnectFour-v0", num_rows=0, num_cols=10)
    with pytest.raises(ValueError, match="the sizes must be >= 1, the apples >= 0"):
        make("Snake-v0", width=-5, height=-5)
    assert make("PigDice-v1", max_turns=None).max_turns is None  # None is no limit, as every game's base takes
    env = make("KuhnPoker-v1", rounds=np.int64(2))  # a count read from an array plays as its int
    assert env.rounds == 2 and type(env.rounds) is int
    assert make("Nim-v0", piles=[3, 4]).initial_piles == (3, 4)


@pytest.mark.parametrize("env_id", sorted(REQUIRED_IDS))
def test_protocol_basics(env_id):
    env = make(env_id)
    assert env.env_id == env_id and env.observation_style == DEFAULT_STYLES.get(env_id, env.observation_style)
    with pytest.raises(RuntimeError):
        env.step("[0]")  # not reset yet
    env.reset(seed=3)
    first = env.messages(0)[0]
    assert first.sender == GAME and first.kind == "rules" and first.data[0] == 0
    assert env.legal_actions() and env.legal_actions(1 - env.current_player()) == []
    state = env.state()
    assert state["turn"] == 0 and state["error_count"] == 0 and not state["done"] and state["rewards"] is None
    actions = _play_out(env, seed=7)
    replay = make(env_id)
    replay.reset(seed=3)
    assert _play_out(replay, seed=7) == actions and replay.state() == env.state()  # seeded: identical
    assert env.legal_actions() == [] and env.role_name(1) == "Player 1"


@pytest.mark.parametrize("env_id", sorted(REQUIRED_IDS))
def test_observation_styles(env_id):
    for style in ("full_history", "first_last"):
        env = make(env_id, observation_style=style)
        env.reset(seed=0)
        env.step(env.legal_actions()[0])
        player = env.current_player()
        messages, text = env.messages(player), env.observation(player)
        assert text == env.observation()
        if style == "full_history":
            assert all(m.text in text for m in messages)
        else:
            assert text.startswith(messages[0].text) and messages[-1].text in text
            assert text.endswith("Reply with your next action.")


def test_chance_injection_forces_cards_dice_rolls_and_cells():
    kuhn = make("KuhnPoker-v1")
    kuhn.reset(seed=0, chance={"deal": [(2, 0), (0, 1)]})
    assert kuhn.state()["cards"] == [2, 0] and kuhn.info_set(0) == "K"
    pig = make("PigDice-v1")
    pig.reset(seed=0, chance={"roll": [6, 1]})
    pig.step("[roll]")
    assert pig.state()["turn_total"] == 6
    pig.step("[roll]")
    assert pig.current_player() == 1 and pig.state()["turn_total"] == 0
    dice = make("LiarsDice-v1")
    dice.reset(seed=0, chance={"dice": [((1, 1, 1, 1, 1), (2, 2, 2, 2, 2))]})
    assert dice.state()["dice"] == [[1] * 5, [2] * 5]
    snake = make("Snake-v0")
    snake.reset(seed=0, chance={"cell": [(0, 0), (4, 4), (1, 0), (2, 2)]})
    state = snake.state()
    assert state["snakes"] == [[[0, 0]], [[4, 4]]] and state["apples"] == [[1, 0], [2, 2]]
    snake.step("[right]")
    snake.step("[down]")  # snake 0 eats the apple at (1, 0); the next cell is drawn from the generator
    assert snake.state()["scores"] == [1, 0] and len(snake.state()["apples"]) == 2


def test_seeds_differ():
    deals = set()
    for seed in range(20):
        env = make("KuhnPoker-v1")
        env.reset(seed)
        deals.add(tuple(env.state()["cards"]))
    assert len(deals) > 1


def test_error_allowance_retry_then_forfeit():
    env = make("TicTacToe-v0", error_allowance=1)
    env.reset(0)
    result = env.step("the centre")
    assert not result.info["valid"] and not result.done and env.current_player() == 0 and env.error_count == 1
    assert env.messages(1)[-2].kind == "invalid" and env.messages(1)[-2].data == (0, "format")
    result = env.step("[9]")
    assert result.done and result.rewards == {0: -1, 1: 0} and env.messages(1)[-2].kind == "forfeit"
    strict = make("TicTacToe-v0", error_allowance=0)
    strict.reset(0)
    assert strict.step("[4] [4]").info["valid"] and strict.step("[4]").rewards == {1: -1, 0: 0}


def test_max_turns_truncates_to_a_draw():
    env = make("ConnectFour-v0", max_turns=3)
    env.reset(0)
    for col in (0, 1):
        assert not env.step(f"[col {col}]").done
    result = env.step("[col 2]")
    assert result.done and result.rewards == {0: 0, 1: 0} and env.messages(0)[-1].kind == "draw"
    with pytest.raises(ValueError):
        make("Nim-v0", max_turns=0)


def test_end_from_outside():
    env = make("Nim-v0")
    env.reset(0)
    result = env.end({0: 0.5, 1: -1.5}, "Player 1 timed out.")
    assert result.done and env.done and env.rewards == {0: 0.5, 1: -1.5} and env.reason == "Player 1 timed out."
    assert env.messages(1)[-1].kind == "ended"
    for bad in (float("nan"), float("inf")):  # a NaN would count as a draw and make RAE's baseline NaN
        env.reset(0)
        with pytest.raises(ValueError, match="finite"):
            env.end({0: bad, 1: 1.0}, "broken")


def test_pig_turn_limit_counts_player_turns_and_scores_decide():
    env = make("PigDice-v1", max_turns=3)
    env.reset(0, chance={"roll": [5, 3, 4]})
    env.step("[roll]")
    env.step("[hold]")  # player 0 banks 5
    env.step("[roll]")
    env.step("[hold]")  # player 1 banks 3
    env.step("[roll]")
    result = env.step("[hold]")  # player 0 banks 4: the third turn ends the game
    assert result.done and result.rewards == {0: 1, 1: -1} and env.state()["scores"] == [9, 3]


def test_pig_short_prompts_state_the_scores_and_the_stake():
    """PigDiceState-v1 shows the rules and the latest message only, so that message carries the state
    (from the mover's side); the full-history game keeps the reference's bare move request."""
    env = make("PigDiceState-v1")
    env.reset(0, chance={"roll": [5, 3, 4]})
    env.step("[roll]")
    env.step("[hold]")  # player 0 banks 5
    env.step("[roll]")  # player 1 has 3 at stake
    text = env.observation()
    assert text.startswith("Pig dice. You are Player 1;")
    assert "Your score: 0. Your opponent's score: 5. Points at stake this turn: 3.\nYour move" in text
    assert "rolled" not in text and "banked" not in text  # only the latest message follows the rules
    env.step("[hold]")
    assert "Your score: 5. Your opponent's score: 3. Points at stake this turn: 0." in env.observation()
    full = make("PigDice-v1")
    full.reset(0, chance={"roll": [5]})
    full.step("[roll]")
    assert full.messages(0)[-1].text == "Your move: [roll] or [hold]."


def test_negotiation_outcome_is_decided_by_item_counts():
    env = make("SimpleNegotiation-v1")
    env.reset(0)
    env.step("[Offer: 1 Wood -> 2 Gold]")  # player 0 gives 1 item for 2
    env.step("Sure. [Accept]")
    while not env.done:
        env.step("[Pass]")
    assert env.state()["resources"][0] == {"Wood": 9, "Gold": 12} and env.rewards == {0: 1, 1: -1}


def test_kuhn_v2_pays_textbook_chips():
    """One-round KuhnPoker-v2: every deal and betting line pays the textbook amounts."""
    lines = {("check", "check"): 1, ("bet", "fold"): None, ("bet", "call"): 2,
             ("check", "bet", "fold"): None, ("check", "bet", "call"): 2}
    for c0 in range(3):
        for c1 in range(3):
            if c0 == c1:
                continue
            for line, stake in lines.items():
                env = make("KuhnPoker-v2", rounds=1)
                env.reset(0, chance={"deal": [(c0, c1)]})
                assert env.current_player() == 0
                for move in line:
                    env.step(f"[{move}]")
                if stake is None:  # the last player folded
                    folder = (len(line) - 1) % 2
                    expected = 1 if folder == 1 else -1
                else:
                    expected = stake if c0 > c1 else -stake
                assert env.state()["chips"] == [expected, -expected], (c0, c1, line)
                assert env.rewards == {0: int(np.sign(expected)), 1: -int(np.sign(expected))}


def test_a_game_asked_before_reset_or_for_a_third_seat_says_what_to_do():
    """observation(), messages() and state() before reset() were AttributeErrors, a seat 2 an IndexError."""
    env = make("TicTacToe-v0")
    for ask in (env.observation, env.state, lambda: env.messages(0)):
        with pytest.raises(RuntimeError, match=r"TicTacToe-v0: no game yet; call reset\(seed\) first"):
            ask()
    with pytest.raises(RuntimeError, match=r"no game in play \(over, or never started\); call reset\(seed\)"):
        env.step("[4]")
    env.reset(0)
    assert env.observation(1) == env.observation(1) and env.messages(1) and env.state()["turn"] == 0
    with pytest.raises(ValueError, match="player must be 0 or 1, got 2"):
        env.observation(2)
