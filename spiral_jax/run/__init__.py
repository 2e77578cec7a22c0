"""The layer above the RL core: turning a config into a run (`setup.py`)."""
