"""A checkpoint from before linear weights became out-major is refused with a clear error."""
import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import SingleDeviceSharding

from spiral_jax.checkpoint import Checkpointer, LayoutError
from spiral_jax.checkpoint_layout import saved_layers_stacked


def test_old_layout_checkpoint_is_refused(tmp_path):
    state = {"w": jnp.arange(6.0).reshape(2, 3)}
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(1, state, [], {"step": 1})
    ckpt.wait()
    restored, _, meta = ckpt.restore(None, state, None)
    assert meta["step"] == 1 and jnp.array_equal(restored["w"], state["w"])
    meta_file = _meta_file(tmp_path)
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
    # A partial restore (eval, export): the restore item is the template, the checkpoint the structure.
    ("Type mismatch at key path ('params', 'layers'): template has type <class 'dict'>, but structure has type "
     "<class 'list'>.", False),
])
def test_both_wordings_of_orbaxs_mismatch_say_how_the_layers_were_saved(mismatch, stacked):
    assert saved_layers_stacked(mismatch) is stacked


def _meta_file(directory):
    (path,) = [p for p in directory.rglob("*") if p.is_file() and "meta" in str(p.relative_to(directory))
               and p.read_text(errors="ignore").lstrip().startswith("{\"step\"")]
    return path


def _saved(tmp_path, params, step=3):
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(step, {"params": params, "opt": {"mu": jnp.zeros(2)}}, [], {"step": step})
    ckpt.wait()
    return params


@pytest.mark.parametrize("recorded", [True, False], ids=["shapes in meta", "written before they were"])
def test_parameters_of_other_names_or_shapes_are_refused_with_what_differs_and_kept(tmp_path, recorded):
    """Another LoRA rank (other shapes) or targets (other names) is a config unlike the one that wrote
    the checkpoint, not a damaged file: a LayoutError, and the checkpoint stays for the right config.
    Names and shapes are compared before any array is read where the checkpoint records them; older
    checkpoints are refused from what orbax says, or, by the partial read of eval and export, from
    what it hands back abstract."""
    saved = _saved(tmp_path, {"layers": [{"q_a": jnp.ones((8, 16)), "v_a": jnp.ones((8, 16))}]})
    if not recorded:
        meta = json.loads(_meta_file(tmp_path).read_text())
        del meta["param_shapes"]
        _meta_file(tmp_path).write_text(json.dumps(meta))
    like = lambda params: {"params": params, "opt": {"mu": jnp.zeros(2)}}  # noqa: E731
    other_rank = {"layers": [{"q_a": jnp.ones((4, 16)), "v_a": jnp.ones((4, 16))}]}
    shape = r"q_a'\] as \(8, 16\) where the config makes \(4, 16\)" if recorded else "stored shape"
    with pytest.raises(LayoutError, match=shape):
        Checkpointer(tmp_path, async_save=False).restore(None, like(other_rank), None)
    abstract = lambda params: jax.tree.map(  # noqa: E731
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=SingleDeviceSharding(jax.devices()[0])), params)
    fewer = {"layers": [{"q_a": jnp.ones((8, 16))}]}
    if recorded:  # a partial read cannot tell parameters it drops
        with pytest.raises(LayoutError, match=r"holds 1 it does not make \(first \['layers'\]\[0\]\['v_a'\]\)"):
            Checkpointer(tmp_path, async_save=False).restore_params(abstract(fewer))
    more = {"layers": [{**saved["layers"][0], "k_a": jnp.ones((8, 16))}]}
    with pytest.raises(LayoutError, match=r"lacks 1 parameter\(s\) this run's config makes \(first .*'k_a'"):
        Checkpointer(tmp_path, async_save=False).restore_params(abstract(more))
    assert (tmp_path / "3").is_dir() and not list(tmp_path.glob("*.unreadable"))
    params, step, _ = Checkpointer(tmp_path, async_save=False).restore_params(abstract(saved))
    assert step == 3 and jnp.array_equal(params["layers"][0]["v_a"], saved["layers"][0]["v_a"])


def test_parameters_of_other_stacked_layers_are_refused_with_the_setting(tmp_path):
    _saved(tmp_path, {"layers": {"w": jnp.ones((2, 3))}})
    one_by_one = {"params": {"layers": [{"w": jnp.ones(3)}, {"w": jnp.ones(3)}]}, "opt": {"mu": jnp.zeros(2)}}
    with pytest.raises(LayoutError, match=r"holds the layers stacked .*--config\.model\.scan_layers=True"):
        Checkpointer(tmp_path, async_save=False).restore(None, one_by_one, None)
