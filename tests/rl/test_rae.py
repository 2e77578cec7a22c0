"""RAE: per (game, role) baselines read before they are updated; the ablation switch; checkpoints."""

import orbax.checkpoint as ocp
import pytest

from spiral_jax.rl.rae import (RAEConfig, assign_advantages, baseline, baseline_metrics,
                               init_rae_state, label_game)
from spiral_jax.rl.samples import TurnSample

# A scripted series of finished games: (game, {role: final reward}).
GAMES = [
    ("kuhn", {0: 1.0, 1: -1.0}),
    ("kuhn", {0: -1.0, 1: 1.0}),
    ("ttt", {0: 0.0, 1: 0.0}),
    ("kuhn", {0: 1.0, 1: -1.0}),
    ("kuhn", {0: -1.5, 1: 0.5}),  # role 0 made an invalid move
    ("ttt", {0: 1.0, 1: -1.0}),
]
# Worked by hand with decay 0.95: A = R - b, then b <- 0.95 b + 0.05 R.
EXPECTED_ADVANTAGES = [
    {0: 1.0, 1: -1.0},
    {0: -1.05, 1: 1.05},  # b = (0.05, -0.05)
    {0: 0.0, 1: 0.0},
    {0: 1.0025, 1: -1.0025},  # b = (-0.0025, 0.0025)
    {0: -1.547625, 1: 0.547625},  # b = (0.047625, -0.047625)
    {0: 1.0, 1: -1.0},  # ttt's baselines are still 0: games do not share baselines
]
EXPECTED_FINAL = {"kuhn": {"0": -0.02975625, "1": -0.02024375}, "ttt": {"0": 0.05, "1": -0.05}}


def _play(games, cfg=RAEConfig(), state=None):
    state = init_rae_state() if state is None else state
    advantages = []
    for game, rewards in games:
        adv, state = assign_advantages(state, game, rewards, cfg)
        advantages.append(adv)
    return advantages, state


def test_scripted_baselines_and_advantages():
    advantages, state = _play(GAMES)
    for got, want in zip(advantages, EXPECTED_ADVANTAGES):
        assert got == pytest.approx(want, abs=1e-12)
    for game, roles in EXPECTED_FINAL.items():
        for role, b in roles.items():
            assert baseline(state, game, int(role)) == pytest.approx(b, abs=1e-12)
    assert baseline_metrics(state)["rae/baseline/kuhn/0"] == pytest.approx(-0.02975625)


def test_state_is_not_mutated():
    _, s1 = _play(GAMES[:1])
    before = {g: dict(r) for g, r in s1["baselines"].items()}
    _play(GAMES[1:], state=s1)
    assert s1["baselines"] == before


def test_decay_is_configurable():
    advantages, state = _play([("kuhn", {0: 1.0})] * 2, RAEConfig(decay=0.5))
    assert [a[0] for a in advantages] == [1.0, 0.5]
    assert baseline(state, "kuhn", 0) == 0.75


def test_ablation_uses_baseline_zero():
    advantages, state = _play(GAMES, RAEConfig(enabled=False))
    assert advantages == [dict(rewards) for _, rewards in GAMES]
    assert baseline(state, "kuhn", 0) == 0.0 and state == init_rae_state()


def _turns(game, roles_per_turn):
    return [TurnSample([1], [2], [0.0], game, role, turn) for turn, role in enumerate(roles_per_turn)]


def test_label_game_sets_advantages_per_role_and_drops_zeros():
    cfg = RAEConfig(decay=0.5)
    state = init_rae_state()
    labelled, state = label_game(state, "kuhn", _turns("kuhn", [0, 1, 0]), {0: 1.0, 1: -1.0}, cfg)
    assert [(s.role, s.turn, s.advantage) for s in labelled] == [(0, 0, 1.0), (1, 1, -1.0), (0, 2, 1.0)]
    labelled, state = label_game(state, "kuhn", _turns("kuhn", [0, 1]), {0: 0.5, 1: -0.5}, cfg)
    assert labelled == []  # R == b for both roles: exactly zero advantage
    assert baseline(state, "kuhn", 0) == 0.5
    kept, _ = label_game(init_rae_state(), "ttt", _turns("ttt", [0, 1]), {0: 0.0, 1: 0.0},
                         RAEConfig(drop_zero=False))
    assert [s.advantage for s in kept] == [0.0, 0.0]
    with pytest.raises(ValueError, match="does not belong"):
        label_game(state, "kuhn", _turns("ttt", [0]), {0: 1.0})
    with pytest.raises(ValueError, match="does not belong"):
        label_game(state, "kuhn", _turns("kuhn", [1]), {0: 1.0})


def test_state_checkpoints_with_orbax(tmp_path):
    _, state = _play(GAMES[:3])
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "rae", state)
    ckpt.wait_until_finished()
    restored = ckpt.restore(tmp_path / "rae")
    assert restored == state
    assert _play(GAMES[3:], state=restored)[0] == _play(GAMES[3:], state=state)[0]


def test_sharded_baselines_follow_the_reference_schedule():
    """games_per_shard=2: a step's games 0-1 share shard 0's baselines, games 2-3 shard 1's; the
    next step's games 0-1 read shard 0 again. Worked by hand with decay 0.5."""
    cfg = RAEConfig(decay=0.5, games_per_shard=2)
    state = init_rae_state()
    got = []
    for step in ([1.0, 1.0, -1.0, 0.0], [1.0, -1.0]):  # role 0's reward in each game of the step
        for index, reward in enumerate(step):
            labelled, state = label_game(state, "kuhn", _turns("kuhn", [0]), {0: reward}, cfg, index)
            got.append(labelled[0].advantage if labelled else 0.0)
    # shard 0: b 0 -> 0.5 -> 0.75 -> 0.875;  shard 1: b 0 -> -0.5 -> -0.25
    assert got == pytest.approx([1.0, 0.5, -1.0, 0.5, 0.25, -1.875])
    assert state["baselines"]["kuhn@0"]["0"] == pytest.approx(-0.0625)
    assert state["baselines"]["kuhn@1"]["0"] == pytest.approx(-0.25)
    assert baseline_metrics(state) == {"rae/baseline/kuhn/0": pytest.approx((-0.0625 - 0.25) / 2)}
    assert RAEConfig().key("kuhn", 7) == "kuhn"  # unsharded: one set of baselines per game
