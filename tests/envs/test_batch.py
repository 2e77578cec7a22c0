"""BatchRunner: many games in flight, only the answered ones step, finished games are recorded."""
import pytest

from spiral_jax.envs import BatchRunner, RandomOpponent, make


def _runner(**kwargs):
    envs = [make("TicTacToe-v0"), make("KuhnPoker-v1"), make("SimpleNegotiation-v1")]
    return BatchRunner(envs, seed=1, **kwargs)


def test_only_answered_games_step():
    runner = _runner()
    requests = runner.pending()
    assert [r.game for r in requests] == [0, 1, 2]
    assert requests[0].legal_actions == [f"[{i}]" for i in range(9)] and "TicTacToe" in requests[0].observation
    runner.submit({0: "\\boxed{4}"})
    after = runner.pending()
    assert after[1:] == requests[1:]  # untouched games still wait for the same move
    assert after[0].player == 1 and "O" in after[0].observation


def test_records_turns_and_rewards_of_finished_games():
    runner = _runner(auto_reset=False)
    finished = []
    for move in ("[0]", "[3]", "[1]", "[4]"):
        assert runner.submit({0: f"\\boxed{{{move}}}"}) == []
    finished = runner.submit({0: "so \\boxed{2}", 2: "\\boxed{Deny}"})  # game 2: [Deny] is not legal yet
    assert {r.game for r in finished} == {0, 2}
    ttt = next(r for r in finished if r.game == 0)
    assert ttt.rewards == {0: 1, 1: -1} and [t.player for t in ttt.turns] == [0, 1, 0, 1, 0]
    assert ttt.turns[-1].response == "so \\boxed{2}" and ttt.turns[-1].action == "[2]" and ttt.turns[-1].valid
    assert ttt.env_id == "TicTacToe-v0" and not ttt.truncated
    nego = next(r for r in finished if r.game == 2)
    assert nego.rewards == {0: -1.5, 1: 0.5} and nego.turns[0].valid is False
    assert [r.game for r in runner.pending()] == [1]  # without auto_reset the slots idle
    with pytest.raises(ValueError):
        runner.submit({0: "[4]"})


def test_truncation_and_auto_reset_with_fresh_seeds():
    runner = BatchRunner([make("PigDice-v1")], seed=0, max_turns=4)
    seeds = set()
    for _ in range(3):
        finished = []
        while not finished:
            finished = runner.submit({0: "[roll]"})
        record = finished[0]
        seeds.add(record.seed)
        assert len(record.turns) <= 4
        if len(record.turns) == 4:
            assert record.truncated and record.rewards == {0: 0, 1: 0}
    assert len(seeds) == 3 and runner.games_started == 4


def test_random_play_through_many_games_is_reproducible():
    def run():
        runner = BatchRunner([make(e) for e in ("Nim-v0", "LiarsDice-v1", "Snake-v0")] * 3, seed=7)
        opponent, results = RandomOpponent(0), []
        while len(results) < 30:
            requests = runner.pending()
            answers = {r.game: opponent.act(runner.envs[r.game]) for r in requests[::2]}  # half of them
            results += [(r.env_id, r.seed, len(r.turns), r.rewards[0]) for r in runner.submit(answers)]
        return results

    assert run() == run()


def test_first_game_offsets_the_record_index_and_needs_auto_reset_off():
    """A runner playing games 4 and 5 of a larger set records them as games 4 and 5 (their seeds are
    those of the whole set's games 4 and 5); restarting its slots would reuse the next runner's seeds."""
    envs = [make("TicTacToe-v0") for _ in range(6)]
    whole = BatchRunner(envs, seed=3, auto_reset=False)
    share = BatchRunner([make("TicTacToe-v0") for _ in range(2)], seed=3, auto_reset=False, first_game=4)
    assert [r.game for r in share.pending()] == [0, 1]  # requests name the runner's slots
    finished = []
    while share.pending():
        finished += share.submit({r.game: "\\boxed{" + r.legal_actions[0] + "}" for r in share.pending()})
    assert sorted((r.game, r.seed) for r in finished) == [(4, whole.envs[4].seed), (5, whole.envs[5].seed)]
    with pytest.raises(ValueError, match="first_game=4 needs auto_reset=False"):
        BatchRunner([make("TicTacToe-v0")], seed=3, first_game=4)
