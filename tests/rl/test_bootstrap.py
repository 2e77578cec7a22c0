"""The bootstrap's teachers: what each one's imitation targets are, and that only `scripted` has a
strategy."""
from collections import Counter

import numpy as np
import pytest

from spiral_jax.config import base_config
from spiral_jax.run.build import build_tokenizer
from spiral_jax.run.setup import run_spec
from spiral_jax.envs import extract_action, make
from spiral_jax.models import ModelConfig
from spiral_jax.rl.bootstrap import HashedRandomPlayer, boxed, imitation_samples


@pytest.fixture(scope="module")
def tok():
    c = base_config()
    c.tokenizer.path = "embedded"
    c.model.random.vocab_size = 2048
    return build_tokenizer(run_spec(c), ModelConfig(**c.model.random.to_dict()))


def _moves(tok, samples):
    return [extract_action(tok.decode(s.response_ids)) for s in samples]


def _first_turns(tok, samples):
    return [s for s in samples if s.turn == 0]


def test_random_teacher_plays_every_legal_opening_and_ends_with_the_turn_token(tok):
    samples = imitation_samples(["TicTacToe-v0"], [1.0], tok, 400, seed=0, explore=0.0, teacher="random")
    assert len(samples) == 400 and all(s.advantage == 1.0 for s in samples)
    assert all(s.response_ids[-1] == tok.end_of_turn_id for s in samples)
    opening = Counter(_moves(tok, _first_turns(tok, samples)))
    assert set(opening) == {f"[{i}]" for i in range(9)}  # no preference for the centre


def test_scripted_teacher_is_minimax_with_fixed_tie_breaks(tok):
    samples = imitation_samples(["TicTacToe-v0"], [1.0], tok, 200, seed=0, explore=0.0, teacher="scripted")
    assert set(_moves(tok, _first_turns(tok, samples))) == {"[4]"}  # always the centre


def test_every_target_is_legal_where_it_was_chosen(tok):
    for teacher in ("random", "hashed", "scripted"):
        samples = imitation_samples(["KuhnPokerChips-v0", "TicTacToe-v0"], [1.0, 1.0], tok, 150, seed=1,
                                    explore=0.3, teacher=teacher)
        for s, move in zip(samples, _moves(tok, samples)):
            prompt = tok.decode(s.prompt_ids)
            assert move is not None and move in prompt, (teacher, move)  # legal moves are listed


def _kuhn_state(card: int):
    env = make("KuhnPokerChips-v0")
    env.reset(0, chance={"deal": [(card, (card + 1) % 3)]})
    return env


def test_hashed_teacher_fixes_a_distribution_per_observation():
    player = HashedRandomPlayer(seed=0, play_seed=0)
    dists = [player.distribution(_kuhn_state(card)) for card in range(3)]
    assert all(d.sum() == pytest.approx(1.0) and d.min() >= 0.1 for d in dists)  # a fifth uniform
    np.testing.assert_array_equal(dists[0], HashedRandomPlayer(0, 99).distribution(_kuhn_state(0)))
    assert len({round(d[0], 6) for d in dists}) == 3  # the card changes the target
    assert not np.allclose(dists[0], HashedRandomPlayer(1).distribution(_kuhn_state(0)))  # so does the seed
    moves = Counter(player.act(_kuhn_state(0)) for _ in range(4000))
    legal = _kuhn_state(0).legal_actions()
    assert moves[legal[0]] / 4000 == pytest.approx(dists[0][0], abs=0.03)


def test_legal_teacher_weighs_each_legal_answer_by_the_models_probability(tok):
    """score gives log-probs; the targets are their softmax over the legal answers, per state."""
    def score(pairs):  # a fake model that prefers [bet] / [call] three to one
        return [np.log(0.6) if tok.decode(a).startswith(("\\boxed{bet", "\\boxed{call")) else np.log(0.2)
                for _, a in pairs]

    samples = imitation_samples(["KuhnPokerChips-v0"], [1.0], tok, 20, seed=0, explore=0.0,
                                teacher="legal", score=score)
    assert len(samples) == 2 * 20  # every Kuhn node has two legal moves
    for first, second in zip(samples[::2], samples[1::2]):
        assert first.prompt_ids == second.prompt_ids
        weights = {m: s.advantage for m, s in zip(_moves(tok, [first, second]), [first, second])}
        aggressive = weights.get("[bet]", weights.get("[call]"))
        assert aggressive == pytest.approx(0.75) and sum(weights.values()) == pytest.approx(1.0)


def test_distribution_targets_weigh_every_legal_move_by_the_teachers_probability(tok):
    """targets='distribution': per turn, one sample per legal move, weighted by the hashed teacher's
    distribution for that observation (the same turns as targets='sampled' with the same seed)."""
    kw = dict(seed=3, explore=0.0, teacher="hashed", hash_seed=5, hash_uniform=0.5)
    sampled = imitation_samples(["TicTacToe-v0"], [1.0], tok, 12, **kw)
    full = imitation_samples(["TicTacToe-v0"], [1.0], tok, 12, targets="distribution", **kw)
    teacher, start = HashedRandomPlayer(seed=5, uniform=0.5), 0
    for one in sampled:
        board = tok.decode(one.prompt_ids)
        free = board.split("Free cells: ")[1].split("\n")[0].split(", ")
        group, start = full[start:start + len(free)], start + len(free)
        assert all(s.prompt_ids == one.prompt_ids for s in group)
        assert sorted(_moves(tok, group)) == sorted(free)  # every legal move, once
        env = _replay(board)
        want = dict(zip(env.legal_actions(), teacher.distribution(env)))
        assert {m: s.advantage for m, s in zip(_moves(tok, group), group)} == pytest.approx(want)
    assert start == len(full)
    uniform = imitation_samples(["TicTacToe-v0"], [1.0], tok, 3, seed=0, explore=0.0, teacher="random",
                                targets="distribution")
    assert [s.advantage for s in uniform[:9]] == pytest.approx([1 / 9] * 9)  # the empty board
    with pytest.raises(ValueError, match="needs a random or hashed teacher"):
        imitation_samples(["TicTacToe-v0"], [1.0], tok, 3, seed=0, explore=0.0, teacher="scripted",
                          targets="distribution")


def _replay(board_text: str):
    """A TicTacToe env in the position an observation shows (the marks read off its board)."""
    rows = board_text.split("free cells show their numbers):\n")[1].split("\n")[:3]
    cells = " ".join(rows).split()
    env = make("TicTacToe-v0")
    env.reset(0)
    o = [i for i, c in enumerate(cells) if c == "O"]
    x = [i for i, c in enumerate(cells) if c == "X"]
    for a, b in zip(o + [None], x + [None]):
        for move in (a, b):
            if move is not None:
                env.step(f"[{move}]")
    return env


def test_unknown_teacher_and_missing_score_are_clear_errors(tok):
    with pytest.raises(ValueError, match="bootstrap.teacher='minimax'"):
        imitation_samples(["TicTacToe-v0"], [1.0], tok, 4, seed=0, explore=0.0, teacher="minimax")
    with pytest.raises(ValueError, match="pass score"):
        imitation_samples(["TicTacToe-v0"], [1.0], tok, 4, seed=0, explore=0.0, teacher="legal")


def test_boxed_round_trips_through_the_action_rules():
    for action in ("[4]", "[bet]", "[0 2]"):
        assert extract_action(boxed(action)) == action


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_bootstrap_learning_rate_schedule(schedule):
    """Warm-up to bootstrap.learning_rate, then constant, or a cosine that reaches 0 at the last step."""
    from spiral_jax.rl.train_step import make_schedule

    c = base_config()
    c.bootstrap.update(enabled=True, steps=300, warmup_steps=50, learning_rate=2e-3, schedule=schedule)
    lr = make_schedule(run_spec(c).bootstrap.train)
    assert float(lr(0)) == 0.0 and float(lr(50)) == pytest.approx(2e-3)
    if schedule == "constant":
        assert float(lr(300)) == pytest.approx(2e-3)
    else:
        assert float(lr(175)) == pytest.approx(1e-3, rel=1e-4) and float(lr(300)) == pytest.approx(0.0, abs=1e-9)
