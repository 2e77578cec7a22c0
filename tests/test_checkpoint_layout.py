"""A checkpoint from before linear weights became out-major is refused with a clear error."""
import json

import jax.numpy as jnp
import pytest

from spiral_jax.checkpoint import Checkpointer, _saved_layers_stacked


def test_old_layout_checkpoint_is_refused(tmp_path):
    state = {"w": jnp.arange(6.0).reshape(2, 3)}
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(1, state, [], {"step": 1})
    ckpt.wait()
    restored, _, meta = ckpt.restore(None, state, None)
    assert meta["step"] == 1 and jnp.array_equal(restored["w"], state["w"])
    (meta_file,) = [p for p in tmp_path.rglob("*") if p.is_file() and "meta" in str(p.relative_to(tmp_path))
                    and p.read_text(errors="ignore").lstrip().startswith("{\"step\"")]
    old = json.loads(meta_file.read_text())
    del old["param_layout"]  # what a checkpoint written before the change holds
    meta_file.write_text(json.dumps(old))
    with pytest.raises(ValueError, match=r"older layout.*start a new out_dir"):
        Checkpointer(tmp_path, async_save=False).restore(None, state, None)


def test_a_checkpoint_of_other_stacked_layers_is_refused_with_the_setting_and_kept(tmp_path):
    """Layers saved stacked (model.scan_layers on) and resumed one by one: the error names the
    setting that differs, and the checkpoint stays where it is (it is not a damaged file)."""
    stacked = {"layers": {"w": jnp.ones((2, 3))}}
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(4, stacked, [], {"step": 4})
    ckpt.wait()
    one_by_one = {"layers": [{"w": jnp.ones(3)}, {"w": jnp.ones(3)}]}
    with pytest.raises(ValueError, match=r"holds the layers stacked .*--config\.model\.scan_layers=True"):
        Checkpointer(tmp_path, async_save=False).restore(None, one_by_one, None)
    assert (tmp_path / "4").is_dir() and not list(tmp_path.glob("*.unreadable"))
    restored, _, _ = Checkpointer(tmp_path, async_save=False).restore(None, stacked, None)
    assert jnp.array_equal(restored["layers"]["w"], stacked["layers"]["w"])


@pytest.mark.parametrize("mismatch, stacked", [
    # orbax 0.12: the restore item is the Source, the checkpoint the Target.
    ("User-provided restore item and on-disk value metadata tree structures do not match:\nlayers:\n"
     "    - Source: <class 'list'>\n    - Target: <class 'dict'>\nIf this mismatch is intentional, ...", True),
    ("... tree structures do not match:\nlayers:\n    - Source: <class 'dict'>\n    - Target: <class 'list'>\n",
     False),
    # orbax 0.11: the restore item is lhs, the checkpoint rhs.
    ("User-provided restore item and on-disk value metadata tree structures do not match: "
     "{'layers': Diff(lhs=<class 'list'>, rhs=<class 'dict'>)}", True),
    ("... tree structures do not match: {'layers': Diff(lhs=<class 'dict'>, rhs=<class 'list'>)}", False),
    ("... tree structures do not match: {'embed': Diff(lhs=<class 'dict'>, rhs=<class 'list'>)}", None),
])
def test_both_wordings_of_orbaxs_mismatch_say_how_the_layers_were_saved(mismatch, stacked):
    assert _saved_layers_stacked(mismatch) is stacked
