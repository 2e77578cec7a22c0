"""The layer above the RL core: a config read once (`setup.py`) into a `RunSpec` (`spec.py`), the run's
state as one checkpointed value (`state.py`), a step's data (`collect.py`), the one evaluation path
(`evaluate.py`), the step's scalars (`metrics.py`), summary.json (`summary.py`), and the loop that
drives them (`loop.py`: `Trainer`)."""
from spiral_jax.run.loop import PREEMPTED_EXIT_CODE, Trainer, TrainingDiverged
from spiral_jax.run.setup import run_spec
from spiral_jax.run.spec import RunSpec
from spiral_jax.run.state import RunState

__all__ = ["PREEMPTED_EXIT_CODE", "RunSpec", "RunState", "Trainer", "TrainingDiverged", "run_spec"]
