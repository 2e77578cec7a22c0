"""What a run writes stays in its out_dir and what it deletes is its own: transcript names made from
hostile opponent specs, --overwrite by the run's manifest, export folders that are never the current,
home or run folder, an atomic lock takeover, and an unwritable out_dir as one line."""
from spiral_jax.rl.trainer import Trainer
from tests.eval.test_api_player import _serve
from tests.trainer.test_trainer import tiny_config


def test_training_eval_transcripts_of_a_hostile_spec_stay_in_out_dir(tmp_path):
    """`openai:m@http://host/ok/../../../../../../../escaped/v1` as an evaluation opponent: each step's
    transcript is a file in out_dir/eval/step<N>/, none is written outside out_dir or overwritten."""
    server = _serve()
    try:
        spec = f"openai:m@http://127.0.0.1:{server.server_port}/ok/../../../../../../../escaped/v1"
        trainer = Trainer(tiny_config(tmp_path / "deep" / "er", **{"eval.opponents": (spec,), "eval.kuhn_samples": -1}),
                          log=lambda *_: None)
        for step in (0, 1):
            trainer.step = step
            trainer.evaluate(2)
    finally:
        server.shutdown()
        server.server_close()
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.jsonl"))
    assert [p.parts[:5] for p in written] == [("deep", "er", "run", "eval", "step0"),
                                              ("deep", "er", "run", "eval", "step1")], written
    assert not list(tmp_path.rglob("escaped*"))
