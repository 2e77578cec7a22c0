"""The bootstrap stage of a run: imitation of a teacher before self-play (`rl.bootstrap` makes its
samples), for random tiny models that would otherwise never write a valid move."""
from __future__ import annotations

import functools

from tqdm import tqdm

from spiral_jax.distributed import is_leader
from spiral_jax.rl.bootstrap import TEACHERS, imitation_samples
from spiral_jax.rl.samples import pack, row_multiple, shard_batch
from spiral_jax.rl.train_step import init_train_state, make_update
from spiral_jax.sampling.scoring import sequence_logprobs
from spiral_jax.sharding import batch_shards


def imitate(trainer) -> None:
    """Run the trainer's bootstrap from its `bootstrap_step`, then hand RL a fresh optimiser.

    A stop request saves the stage part-way (phase "bootstrap"); its end is checkpointed as step 0,
    so a resumed run never redoes it. The optimiser's tree is the RL one's, so both share a
    checkpoint slot."""
    b, spec, s = trainer.spec.bootstrap, trainer.spec, trainer.state
    cfg, mesh = trainer.cfg, trainer.mesh
    update = make_update(cfg, b.train, mesh)
    rows = row_multiple(b.train.micro_batch_size, batch_shards(mesh))
    if s.bootstrap_step == 0:
        s.train = init_train_state(s.train.params, cfg, b.train, mesh)
    trainer.log(f"[bootstrap] {b.steps} imitation steps of {TEACHERS[b.teacher]}; real checkpoints skip this stage")
    bar = tqdm(range(s.bootstrap_step, b.steps), desc="bootstrap", unit="step", dynamic_ncols=True,
               disable=not is_leader(), initial=s.bootstrap_step, total=b.steps)
    for i in bar:
        if trainer.stop_requested():
            s.bootstrap_step = i
            trainer.save()
            return
        policy = trainer.full_params(s.train.params, trainer.weights)
        samples = imitation_samples(spec.games.env_ids, spec.games.weights, trainer.tokenizer, b.batch_size,
                                    seed=spec.seed * 1_000_003 + i, explore=b.explore, teacher=b.teacher,
                                    score=functools.partial(sequence_logprobs, policy, trainer.sample_cfg),
                                    hash_seed=spec.seed, hash_uniform=b.hash_uniform, targets=b.targets)
        batch = shard_batch(pack(samples, row_multiple=rows, bucket_rows=True, samples_per_row=trainer.samples_per_row),
                            mesh)
        s.train, metrics = update(s.train, batch, frozen=trainer.weights)
        if i % 10 == 0 or i == b.steps - 1:
            loss = float(metrics[-1]["loss"])
            bar.set_postfix(loss=f"{loss:.3f}")
            trainer.writer.scalars(i, {"bootstrap/loss": loss})
    bar.close()
    s.train, s.phase, s.bootstrap_step = init_train_state(s.train.params, cfg, spec.train, mesh), "rl", 0
    trainer.save()
