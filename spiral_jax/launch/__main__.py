"""`python -m spiral_jax.launch`: the same as `spiral-jax launch`."""
import sys

from spiral_jax.launch import main

sys.exit(main())
