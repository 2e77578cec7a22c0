"""Env tests: the `slow` marker and a summary of the reference traces replayed."""
from tests.envs.ta_traces import REPLAYED


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a slow test (deselect with -m 'not slow')")


def pytest_terminal_summary(terminalreporter):
    if REPLAYED:
        terminalreporter.section("reference traces replayed with full agreement")
        for env_id, (games, steps) in sorted(REPLAYED.items()):
            terminalreporter.write_line(f"{env_id:24s} {games:3d} games {steps:4d} steps")
