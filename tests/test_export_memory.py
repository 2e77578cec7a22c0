"""`spiral-jax export` holds about one copy of the weights: it restores the parameters alone (no
optimiser state) and writes the safetensors one tensor at a time.

Measured as how far the resident memory of an export process grows once it has loaded its libraries,
for a 130 MB model and for a 1.5 MB one (whose growth is the fixed cost: the tokenizer, compiling, the
checkpoint library). The difference is the memory the weights cost. A restore with the AdamW state would add two more copies, and building the whole file in
memory before writing it one more."""
import os
import subprocess
import sys

import jax
import pytest

from spiral_jax.checkpoint import Checkpointer
from spiral_jax.config import config_from_file
from spiral_jax.run.build import build_model
from spiral_jax.run.setup import run_spec, train_config
from spiral_jax.rl.train_step import init_train_state

# Runs the command with a thread that samples the resident memory every 2 ms; prints the most it grew
# above where it stood once Python, JAX and the CLI were loaded.
PEAK = """
import os, sys, threading, time
import jax
from spiral_jax import cli
jax.devices()
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
base, peak, done = rss(), [0], threading.Event()
def watch():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.002)
watcher = threading.Thread(target=watch)
watcher.start()
rc = cli.main(["spiral-jax", *sys.argv[1:]])
done.set()
watcher.join()
print("GREW", max(peak[0], rss()) - base, "RC", rc)
"""


def _sizes(width: int, layers: int) -> list[str]:
    return [f"--config.model.random.hidden_size={width}", f"--config.model.random.intermediate_size={4 * width}",
            f"--config.model.random.num_layers={layers}", f"--config.model.random.head_dim={width // 4}"]


def _train_checkpoint(out, width: int, layers: int) -> int:
    """A run's checkpoint (parameters and AdamW moments) of the main config's model at this size;
    returns the bytes of the float32 parameters."""
    c = config_from_file("configs/tiny_tictactoe.py")
    c.out_dir = str(out)
    c.model.random.update(hidden_size=width, intermediate_size=4 * width, num_layers=layers, head_dim=width // 4)
    cfg, params = build_model(run_spec(c))
    state = init_train_state(params, cfg, train_config(c.optim), None)
    ckpt = Checkpointer(f"{out}/checkpoints", async_save=False)
    ckpt.save(1, state, [], dict(step=1, seed=0, rae={}, pool_steps=[], config=c.to_json(), totals={},
                                 phase="rl", bootstrap_step=0))
    ckpt.close()
    return 4 * sum(x.size for x in jax.tree.leaves(params))


def _export_peak_bytes(out, width: int, layers: int) -> int:
    cmd = [sys.executable, "-c", PEAK, "export", "--config=configs/tiny_tictactoe.py", f"--config.out_dir={out}",
           *_sizes(width, layers), f"--out={out}/exported"]
    # One CPU device: the tests' 8 fake devices would hold 8 replicas of the weights in host memory,
    # where 8 real accelerators hold them in their own.
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    # A fixed mmap threshold makes glibc hand every large buffer back to the kernel when it is freed;
    # with its default sliding threshold, freed restore buffers may stay in the heap, and the resident
    # size measures the allocator's timing, which varies from run to run, instead of what the export holds.
    env.update(JAX_PLATFORMS="cpu", MALLOC_MMAP_THRESHOLD_=str(2**20))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    line = result.stdout.strip().splitlines()[-1].split()
    assert line[0] == "GREW" and line[-1] == "0", result.stderr[-2000:]
    return int(line[1])


@pytest.mark.slow
def test_export_peak_memory_is_about_one_copy_of_the_weights(tmp_path):
    weights = _train_checkpoint(tmp_path / "big", 512, 8)
    _train_checkpoint(tmp_path / "small", 64, 4)
    assert weights > 100e6
    extra = _export_peak_bytes(tmp_path / "big", 512, 8) - _export_peak_bytes(tmp_path / "small", 64, 4)
    print(f"export of {weights / 1e6:.0f} MB of weights: peak memory {extra / 1e6:.0f} MB above the tiny "
          f"model's ({extra / weights:.2f} copies)")
    assert extra < 1.5 * weights
    assert (tmp_path / "big" / "exported" / "model.safetensors").stat().st_size > weights
