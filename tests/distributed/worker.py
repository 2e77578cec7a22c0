"""One process of the two-host test (tests/distributed/test_multihost.py); also the 1-process run.

Usage: python worker.py OUT_DIR PROCESS_ID NUM_PROCESSES PORT DEVICES [SCHEDULE]
Runs two self-play steps (rollout.schedule=SCHEDULE, default rounds) of a tiny model on a (data=2, fsdp=4) mesh,
checkpoints them and resumes from the checkpoint, and saves, from process 0, the final parameters and RAE
baselines to OUT_DIR/result.npz and OUT_DIR/rae.json, with what the resumed run restored and logged.
"""
import hashlib
import json
import sys
from pathlib import Path

import jax

out, pid, count, port, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
schedule = sys.argv[6] if len(sys.argv) > 6 else "rounds"
jax.config.update("jax_num_cpu_devices", devices)
jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from spiral_jax.config import base_config  # noqa: E402
from spiral_jax.run import Trainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for the tests' tiny sizes
from tests.tiny_models import TINY_RUN  # noqa: E402


def config():
    c = base_config()
    c.out_dir = str(Path(out) / "run")
    c.model.random.update(TINY_RUN)
    c.tokenizer.path = "embedded"
    c.mesh.update(data=2, fsdp=4, tensor=1)
    if count > 1:
        c.distributed.update(enabled=True, coordinator_address=f"localhost:{port}", num_processes=count,
                             process_id=pid)
    c.games.env_ids, c.games.weights = ("TicTacToe-v0", "KuhnPoker-v1"), (1.0, 1.0)
    c.rollout.update(games_per_batch=6, samples_per_step=16, max_new_tokens=6, max_prompt_len=512,
                     temperature=1.0, schedule=schedule, max_in_flight=2)
    c.optim.update(learning_rate=1e-3, normaliser="token_mean", micro_batch_size=8)
    c.train.update(steps=2, eval_every=1000, checkpoint_every=1000, async_checkpointing=False)
    c.eval.update(games=2, final_games=2, max_new_tokens=6, opponents=("random",))
    return c


trainer = Trainer.from_config(config(), bootstrap=False)
initial = multihost_utils.process_allgather(trainer.state.train.params, tiled=True)
for _ in range(2):
    metrics = trainer.train_step()
params = multihost_utils.process_allgather(trainer.state.train.params, tiled=True)
# The games themselves, not only their number: one more rollout with the final weights, digested.
games = trainer.collect().games
digest = hashlib.sha256(json.dumps([(g.record.env_id, g.record.seed, [t.action for t in g.record.turns],
                                     [t.response_ids for t in g.model_turns]) for g in games]).encode()).hexdigest()
if jax.process_index() == 1:
    trainer.request_stop()  # as if SIGTERM reached this host alone
stop = trainer.stop_requested()  # every host must agree, so all stop at the same step
# One checkpoint written by all hosts together, then read back by a resumed run on all of them.
trainer.save()
trainer.ckpt.close()
lines = []
resumed = Trainer.from_config(config(), resume=True, log=lines.append)
restored = multihost_utils.process_allgather(resumed.state.train.params, tiled=True)
restored_exactly = resumed.state.step == 2 and all(np.array_equal(a, b) for a, b in
                                              zip(jax.tree.leaves(params), jax.tree.leaves(restored)))
log_lines = [int(n) for n in multihost_utils.process_allgather(np.array(len(lines)))]  # per process
if jax.process_index() == 0:
    flat = {"/".join(str(k) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    np.savez(Path(out) / "result.npz", **flat)
    (Path(out) / "rae.json").write_text(json.dumps(
        {"rae": trainer.state.rae, "games": metrics["rollout/games"], "samples": metrics["rollout/samples"],
         "processes": jax.process_count(), "devices": jax.device_count(), "stop": stop, "digest": digest,
         "restored_exactly": restored_exactly, "log_lines": log_lines,
         "moved": max(float(np.abs(a - b).max()) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(initial)))}))
