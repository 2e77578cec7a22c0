"""Every key of the base config is read by the code: no key is dead."""
import json
import re
from pathlib import Path

from ml_collections import ConfigDict

from spiral_jax.config import base_config, config_changes

PACKAGE = Path(__file__).resolve().parents[1] / "spiral_jax"
# Sections handed over whole, whose keys are read as fields of the object they become.
WHOLE = {"model.random": "ModelConfig fields", "optim": "TrainConfig fields", "mesh": "make_mesh(**c.mesh)",
         "wandb": "MetricsWriter(wandb=c.wandb.to_dict())", "api": "Rollout(api=c.api.to_dict())"}


def _keys(c: ConfigDict, prefix=""):
    for name, value in c.items():
        path = f"{prefix}{name}"
        if isinstance(value, ConfigDict):
            if path not in WHOLE:
                yield from _keys(value, path + ".")
        else:
            yield path


def test_every_config_key_is_read():
    source = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "config.py")
    source += (PACKAGE / "config.py").read_text().split("def base_config", 1)[0]
    # After base_config: the evaluation protocols, not the tables of what each field takes (checking a
    # value is no use of it).
    source += (PACKAGE / "config.py").read_text().split("EVAL_PROTOCOLS = {", 1)[1]
    dead = []
    for key in _keys(base_config()):
        section, _, name = key.rpartition(".")
        patterns = [rf"\.{name}\b", rf"\[\"{name}\"\]", rf"\b{name}="]
        if not any(re.search(p, source) for p in patterns):
            dead.append(key)
    assert not dead, f"config keys no code reads: {dead}"


def test_config_changes_name_each_changed_value_and_keys_one_side_lacks():
    before = base_config()
    after = base_config()
    after.optim.learning_rate, after.games.env_ids = 3e-6, ("kuhn_poker", "tictactoe")
    changes = config_changes(before.to_json(), after.to_json())
    assert changes == [f'games.env_ids: {json.dumps(list(before.games.env_ids))} -> ["kuhn_poker", "tictactoe"]',
                       f"optim.learning_rate: {before.optim.learning_rate} -> 3e-06"]
    assert config_changes(before.to_json(), before.to_json()) == []
    # A checkpoint written before a key existed, or with no readable config: said plainly, or nothing.
    assert config_changes('{"seed": 0}', '{"seed": 0, "rae": {"enabled": true}}') == ['rae.enabled: "(absent)" -> true']
    assert config_changes("", after.to_json()) == []
