"""The `spiral-jax` command: train, eval and export, each configured by a config file + overrides.

    spiral-jax train  --config configs/tiny_tictactoe.py [--config.train.steps=10] [--resume]
    spiral-jax eval   --config configs/tiny_tictactoe.py [--games 200]
    spiral-jax export --config configs/tiny_tictactoe.py --out exported/   # HF folder
"""
from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

COMMANDS = ("train", "eval", "export")
FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/*.py).",
                                lock_config=True)
flags.DEFINE_bool("resume", False, "train: continue from the newest checkpoint in out_dir.")
flags.DEFINE_integer("games", 0, "eval: games per (game, opponent); default eval.final_games.")
flags.DEFINE_string("out", "", "export: the folder to write the Hugging Face checkpoint to.")
flags.DEFINE_integer("step", -1, "eval/export: checkpoint step (default: the newest).")


def _usage() -> str:
    return __doc__.strip()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(_usage(), file=sys.stderr)
        return 2
    command = argv.pop(1)
    try:
        FLAGS(argv)
    except flags.Error as e:
        print(f"spiral-jax {command}: {e}", file=sys.stderr)
        return 2
    if FLAGS.config is None:
        print(f"spiral-jax {command}: --config is required (e.g. --config configs/tiny_tictactoe.py)",
              file=sys.stderr)
        return 2
    from spiral_jax.rl.trainer import Trainer

    c = FLAGS.config
    if command == "train":
        Trainer(c, resume=FLAGS.resume).run()
        return 0
    trainer = Trainer(c, resume=True)
    if command == "eval":
        results = trainer.evaluate(FLAGS.games or c.eval.final_games)
        print(trainer.table(results))
        return 0
    if not FLAGS.out:
        print("spiral-jax export: --out is required (the folder for the Hugging Face checkpoint)",
              file=sys.stderr)
        return 2
    from spiral_jax.models import save_pretrained
    save_pretrained(trainer.cfg, trainer.state.params, FLAGS.out)
    trainer.tokenizer.hf.save_pretrained(FLAGS.out)
    print(f"wrote a Hugging Face checkpoint (safetensors + config + tokenizer) to {FLAGS.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
