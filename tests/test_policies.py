"""Player names parse to one kind each (spiral_jax/policies.py)."""
import pytest

from spiral_jax.api_player import ApiPlayer
from spiral_jax.policies import KINDS, SCRIPTED, PolicySpec, kind


@pytest.mark.parametrize("name, expected", [
    ("model", "model"), ("self", "self"), ("random", "scripted"), ("scripted", "scripted"),
    ("pool/40", "pool"), ("openai:gpt-4o-mini@https://api.openai.com/v1", "api"),
    ("runs/kuhn/exported", "checkpoint"), ("frozen", "checkpoint"), ("Random", "checkpoint")])
def test_each_name_has_one_kind(name, expected):
    spec = PolicySpec.parse(name)
    assert spec.kind == expected == kind(name) and spec.name == name and spec.kind in KINDS
    assert spec.sampled == (expected not in ("scripted", "api"))


def test_the_game_side_players_and_bad_names():
    assert [kind(n) for n in SCRIPTED] == ["scripted", "scripted"]
    for bad in ("", None, 3):
        with pytest.raises(ValueError, match="random, scripted, self"):
            PolicySpec.parse(bad)


def test_an_api_name_must_say_model_and_url():
    assert ApiPlayer.from_spec("openai:local@http://localhost:8000/v1/").base_url == "http://localhost:8000/v1"
    for bad in ("openai:local", "openai:@http://x", "local@http://x", "openai:m@ftp://x"):
        with pytest.raises(ValueError, match="openai:MODEL@BASE_URL"):
            ApiPlayer.from_spec(bad)
