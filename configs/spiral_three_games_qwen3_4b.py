"""The paper's multi-game run: TicTacToe + Kuhn Poker + Simple Negotiation mixed in every step.

Same learner settings as configs/spiral_kuhn_qwen3_4b.py (the paper's); each game keeps its own RAE
baselines per role. Observation styles are the env defaults, which are SPIRAL's (first_last for
TicTacToe, full history for Kuhn and Negotiation). Equal game weights, as in the reference.
"""
from spiral_jax.config import config_from_file


def get_config():
    c = config_from_file("spiral_kuhn_qwen3_4b.py", relative_to=__file__)
    c.out_dir = "runs/spiral_three_games_qwen3_4b"
    c.games.update(env_ids=("TicTacToe-v0", "KuhnPoker-v1", "SimpleNegotiation-v1"), weights=(1.0, 1.0, 1.0))
    c.eval.env_ids = ()  # evaluate the three training games
    return c
