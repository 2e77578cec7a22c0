"""The command line: help for every command, flags checked per command, the resolved config."""
import json
import os

import pytest

from spiral_jax.cli import COMMANDS, main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "tiny_tictactoe.py")


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_help_listing_its_flags(command, flag, capsys):
    assert main(["spiral-jax", command, flag]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: spiral-jax {command} --config FILE")
    for name in COMMANDS[command][1]:
        assert f"--{name}" in out
    others = set().union(*(names for _, names in COMMANDS.values())) - set(COMMANDS[command][1])
    assert not any(f"--{name}\n" in out or f"--{name}=" in out for name in others)


def test_top_level_help(capsys):
    assert main(["spiral-jax", "--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"spiral-jax {c}" in out for c in COMMANDS)
    assert main(["spiral-jax"]) == 2


def test_a_command_rejects_another_commands_flags(capsys):
    assert main(["spiral-jax", "plan", f"--config={TINY}", "--games", "5", "--suite", "kuhn", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--games is not a plan flag (it belongs to eval)" in err
    assert "--resume is not a plan flag (it belongs to train)" in err and "--suite" in err
    assert main(["spiral-jax", "export", f"--config={TINY}", "--resume"]) == 2


def test_config_prints_the_resolved_config(capsys):
    assert main(["spiral-jax", "config", f"--config={TINY}", "--config.train.steps=7"]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["train"]["steps"] == 7 and config["games"]["env_ids"] == ["TicTacToe-v0"]
    assert main(["spiral-jax", "config", f"--config={TINY}", "--config.train.stepz=7"]) == 2
    assert "stepz" in capsys.readouterr().err
