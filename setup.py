"""spiral-jax: SPIRAL self-play reinforcement learning for LLMs in one JAX program."""
from setuptools import find_packages, setup

# The jax release whose `tpu` extra pins the libtpu (TPU runtime and compiler) that
# `spiral-jax plan --compile` was verified with: jax 0.10.2 with libtpu 0.0.42.1. To move to another
# pair, change this version and rerun tests/test_aot.py and scripts/compile_presets.py
# (docs/memory.md).
JAX_TPU = "0.10.2"
# The floors below are the oldest releases checked: the whole test suite passes with jax 0.10.2 (0.10.1
# and older lack Pallas APIs the decode kernels use), optax 0.2.5 and orbax-checkpoint 0.11.24; with
# transformers 4.51 the main job, exports and the tokenizer, model, CLI and serve tests pass (the
# suite's own code loads models with transformers 5's arguments). spiral_jax/__init__.py checks jax's
# on import, so an older jax is named at once instead of failing mid-run. To move a floor, install
# that release in the test environment, run the README's test command, and change the floor (jax's in
# both places).
JAX_MIN = "0.10.2"

setup(
    name="spiral-jax",
    version="0.1.0",
    description="SPIRAL self-play RL (role-conditioned advantages) for Qwen / Llama LLMs in JAX",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",  # jax 0.10.2 and orbax-checkpoint need 3.11
    packages=find_packages(include=["spiral_jax", "spiral_jax.*"]),
    # The CPU kernels' C++ sources are compiled on first use, on the machine that runs them
    # (spiral_jax/models/cpu_kernels.py).
    package_data={"spiral_jax": ["assets/**/*", "models/kernels/*"]},
    install_requires=[
        f"jax>={JAX_MIN}",
        "numpy",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11.24",
        "safetensors",
        "ml-collections",
        "transformers>=4.51",
        "tokenizers",
        "sentencepiece",
        "tensorboard",
        "tqdm",
    ],
    extras_require={
        # Reference checks against transformers need PyTorch; 2.13.0 is pinned so that a CPU
        # wheel is used (an unpinned torch pulls a multi-GB CUDA build).
        # math-verify, matplotlib and textarena (the eval and textarena extras) so CI checks the
        # grader, the plots and the TextArena adapter against the real package too. pytest-xdist runs
        # the suite in two processes: most of a test's time is XLA compiling on one core.
        # jax[tpu] (with libtpu, the TPU compiler) so CI compiles programs for TPU slices ahead of time
        # (tests/test_aot.py); no TPU is needed for that. openai: `spiral-jax serve` is tested with the
        # official client, as its users call it. peft: LoRA exports are checked by loading them with it.
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "torch==2.13.0", "math-verify",
                 "matplotlib", "textarena", f"jax[tpu]=={JAX_TPU}", "openai", "peft"],
        # gcsfs: a gs:// out_dir for everything a run writes besides checkpoints (spiral_jax/paths.py).
        "gcs": ["gcsfs"],
        "tpu": [f"jax[tpu]=={JAX_TPU}", "gcsfs"],
        # JAX with CUDA for a GPU box; it also brings XLA's GPU compiler, with which `spiral-jax plan
        # --hardware 1xH200 --compile` compiles for NVIDIA presets on a machine without a GPU.
        "cuda": ["jax[cuda12]"],
        "eval": ["math-verify", "datasets", "matplotlib"],
        "textarena": ["textarena"],
        # Weights & Biases logging next to TensorBoard (wandb.enabled=True).
        "wandb": ["wandb"],
    },
    entry_points={"console_scripts": ["spiral-jax=spiral_jax.cli:main"]},
)
