"""LoRA against full fine-tuning, by self-play RL alone, from the same start: the main job's game.

1. The start: configs/tiny_pig.py's format-only bootstrap (imitation of a random move distribution
   fixed per observation: the answer format, no strategy), exported as a Hugging Face folder. A
   random tiny model's embeddings cannot carry a format that frozen weights have never seen, so the
   bootstrap runs as full fine-tuning; LoRA starts where a pretrained model would, knowing the format.
2. From that folder, with no bootstrap, `--steps` of self-play RL twice: full fine-tuning at the
   main job's learning rate, and LoRA (`--rank`, alpha 2 x rank, on every projection) at `--lora_lr`.

Prints win rate against random (Wilson 95% interval) and invalid rate at step 0 and at the end for
both, and their wall times. Everything runs through the `spiral-jax` command line.

    python bench/lora_learning.py                  # 100 steps each, about 20 minutes on 2 CPU cores
    python bench/lora_learning.py --steps 50 --rank 8 --lora_lr 1e-3
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "tiny_pig.py")


def spiral_jax(*args) -> float:
    """Seconds one `spiral-jax` command took. Every run and the export start over (--overwrite), so that
    the bench runs again into the same --out (a train refuses an out_dir that holds a run)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "spiral_jax.cli", *args, "--overwrite"], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/lora_learning")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora_lr", type=float, default=3e-3)
    args = parser.parse_args()
    out = Path(args.out)

    start_run, start = out / "bootstrap", out / "start"
    spiral_jax("train", f"--config={CONFIG}", f"--config.out_dir={start_run}", "--config.train.steps=0",
               "--config.eval.games=0", "--config.eval.final_games=0")
    spiral_jax("export", f"--config={CONFIG}", f"--config.out_dir={start_run}", f"--out={start}")
    common = [f"--config={CONFIG}", f"--config.model.path={start}", "--config.tokenizer.path=embedded",
              "--config.bootstrap.enabled=False", f"--config.train.steps={args.steps}"]
    runs = {"full fine-tuning": [], f"LoRA rank {args.rank}": [
        f"--config.model.lora.rank={args.rank}", f"--config.model.lora.alpha={2.0 * args.rank}",
        f"--config.optim.learning_rate={args.lora_lr}"]}
    rows = []
    for name, extra in runs.items():
        run = out / name.split()[0].lower()
        seconds = spiral_jax("train", *common, f"--config.out_dir={run}", *extra)
        summary = json.loads((run / "summary.json").read_text())
        first, last = (summary["eval"][k]["PigDiceState-v1/random"] for k in ("step0", "final"))
        rows.append(f"| {name} | {first['win']:.1%} | {last['win']:.1%} [{last['win_ci'][0]:.1%}, "
                    f"{last['win_ci'][1]:.1%}] | {last['win'] - first['win']:+.1%} | {last['invalid']:.1%} | "
                    f"{seconds / 60:.1f} min |")
    print(f"PigDiceState-v1, win against random, {args.steps} self-play steps from the same format-only start "
          f"({start})\n")
    print("| run | step 0 | final [95% CI] | gain | invalid (final) | wall |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
