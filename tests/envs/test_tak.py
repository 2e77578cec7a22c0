"""SimpleTak's win: the reference's search (TextArena 0.6.4's, the default) or any chain
(`win_check="chain"`)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spiral_jax.envs import make
from spiral_jax.envs.tak import joins_edges, reference_search_wins

# O (player 0) fills row 2 (cells 8 to 11) below its stone on 5; X plays along the top.
ROW_BELOW_A_STONE = ["[5]", "[0]", "[9]", "[1]", "[8]", "[2]", "[10]", "[12]", "[11]"]


def _play(moves, **overrides):
    env = make("SimpleTak-v0", **overrides)
    env.reset(0)
    for move in moves:
        result = env.step(move)
        assert result.info["valid"], move
    return env, result


def test_a_row_the_reference_search_enters_from_above_is_not_yet_a_win():
    """The search starts at 5, steps down to 9 and runs along the row both ways from there: no one
    path reaches both side edges, so the game goes on. Once O holds 4 the search starts there, runs
    4, 5, 9, 10, 11 and finds the win."""
    env, result = _play(ROW_BELOW_A_STONE)
    assert not result.done and env.current_player() == 1
    _, result = _play(ROW_BELOW_A_STONE + ["[15]", "[4]"])
    assert result.done and result.rewards == {0: 1, 1: -1}


def test_with_the_chain_check_a_full_row_wins_at_once():
    env, result = _play(ROW_BELOW_A_STONE, win_check="chain")
    assert result.done and result.rewards == {0: 1, 1: -1}
    with pytest.raises(ValueError, match="win_check='path': use one of"):
        make("SimpleTak-v0", win_check="path")


@given(st.sampled_from([3, 4, 5]), st.data())
@settings(max_examples=400, deadline=None)
def test_every_win_the_reference_search_finds_is_a_chain_joining_edges(n, data):
    cells = data.draw(st.lists(st.sampled_from(["", "O", "X"]), min_size=n * n, max_size=n * n))
    for symbol in "OX":
        if reference_search_wins(cells, n, symbol):
            assert any(joins_edges(cells, n, c, symbol) for c in range(n * n) if cells[c] == symbol), cells


def test_a_straight_line_from_the_first_stone_is_a_win_for_both_checks():
    n = 4
    for line in ([0, 4, 8, 12], [3, 7, 11, 15], [4, 5, 6, 7], [12, 13, 14, 15]):
        cells = ["O" if i in line else "" for i in range(n * n)]
        assert reference_search_wins(cells, n, "O") and joins_edges(cells, n, line[-1], "O")
        assert not reference_search_wins(cells, n, "X")
    for gap in (4, 5, 6, 7):  # a row with a gap joins nothing
        cells = ["O" if i in (4, 5, 6, 7) and i != gap else "" for i in range(n * n)]
        assert not reference_search_wins(cells, n, "O") and not joins_edges(cells, n, 4 + (gap == 4), "O")
