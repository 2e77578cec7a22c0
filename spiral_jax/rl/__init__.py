"""RL core: turn samples, RAE advantages, losses, and the jitted train step."""
from spiral_jax.rl.losses import token_logprobs, token_loss, token_weights
from spiral_jax.rl.rae import RAEConfig, assign_advantages, baseline_metrics, init_rae_state, label_game
from spiral_jax.rl.reshard import make_reshard
from spiral_jax.rl.samples import Batch, TurnSample, pack, shard_batch
from spiral_jax.rl.train_step import (TrainConfig, TrainState, Update, init_train_state,
                                      make_compute_logprobs, make_optimizer, make_train_step, make_update)

__all__ = [
    "token_logprobs", "token_loss", "token_weights",
    "RAEConfig", "assign_advantages", "baseline_metrics", "init_rae_state", "label_game",
    "make_reshard",
    "Batch", "TurnSample", "pack", "shard_batch",
    "TrainConfig", "TrainState", "Update", "init_train_state", "make_compute_logprobs", "make_optimizer",
    "make_train_step", "make_update",
]
