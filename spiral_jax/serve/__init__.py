"""`spiral-jax serve`: a checkpoint behind an OpenAI-compatible HTTP endpoint, decoded by the same
engine as the trainer's rollouts (`server.py`: HTTP and its limits; `protocol.py`: the OpenAI
formats; `scheduler.py`: continuous batching of every request's answers)."""
from spiral_jax.serve.protocol import ApiError
from spiral_jax.serve.server import ChatServer, ServeSettings

__all__ = ["ApiError", "ChatServer", "ServeSettings"]
