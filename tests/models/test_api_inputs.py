"""The models' public functions named what a caller got wrong, before any JAX traceback or silent cast."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spiral_jax.models import forward, init_params, load_pretrained, save_pretrained
from tests.tiny_models import TINY, jit_forward


@pytest.fixture(scope="module")
def params():
    return init_params(TINY, jax.random.key(0))


def test_forward_names_inputs_it_would_misread(params):
    """Ids of the wrong rank or kind and a mask of another shape failed deep in JAX's indexing; ids past
    the vocabulary gave NaN logits (negative ones wrapped to the table's end) and parameters of another
    size ran: a layer more or a smaller vocabulary gave logits without an error."""
    ids = jnp.array([[1, 2, 3]])
    for bad in (jnp.array([1, 2, 3]), jnp.ones((1, 2, 3), jnp.int32), jnp.array([[1.0, 2.0]]),
                jnp.zeros((1, 0), jnp.int32)):
        with pytest.raises(TypeError, match=r"input_ids must be a non-empty \[batch, length\] array of int"):
            forward(params, TINY, bad)
    with pytest.raises(TypeError, match=r"input_ids must be .* got int32 of shape \(3,\)"):
        jit_forward(params, TINY, jnp.array([1, 2, 3]))  # shapes are checked under jit too
    for token in (TINY.vocab_size, -1):
        with pytest.raises(ValueError, match=f"token id {token}, outside the model's vocabulary"):
            forward(params, TINY, jnp.array([[1, token]]))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 4\), input_ids \(1, 3\)"):
        forward(params, TINY, ids, attention_mask=jnp.ones((1, 4)))
    with pytest.raises(ValueError, match=r"positions has shape \(3,\), input_ids \(1, 3\)"):
        forward(params, TINY, ids, positions=jnp.arange(3))
    with pytest.raises(TypeError, match=r"not a ModelConfig; the order is forward\(params, cfg"):
        forward(TINY, params, ids)
    with pytest.raises(ValueError, match=r"parameter \['layers'\]\[2\]\['\w+'\] is not part of this model"):
        forward({**params, "layers": params["layers"] + [params["layers"][0]]}, TINY, ids)
    with pytest.raises(ValueError, match=r"parameter \['embed'\] has shape \(32, 32\)"):
        forward(init_params(TINY.replace(vocab_size=32), jax.random.key(0)), TINY, ids)
    # A list of ids is an array of ids.
    np.testing.assert_array_equal(forward(params, TINY, [[1, 2, 3]]), forward(params, TINY, ids))


@pytest.mark.parametrize("dtype", ["int8", jnp.int32, bool, "bf16", 3])
def test_a_dtype_that_is_no_float_is_refused(dtype, tmp_path, params):
    """load_pretrained cast the weights to int8 or bool without a word; init_params and a config's
    compute_dtype failed deep inside jax.random or at the first forward."""
    save_pretrained(TINY, params, tmp_path)
    with pytest.raises(TypeError, match=r"dtype=.* is no floating-point dtype; use float32, bfloat16"):
        load_pretrained(tmp_path, dtype=dtype)
    with pytest.raises(TypeError, match="is no floating-point dtype"):
        init_params(TINY, jax.random.key(0), dtype=dtype)
    with pytest.raises(TypeError, match="compute_dtype=.* is no floating-point dtype"):
        TINY.replace(compute_dtype=dtype)


def test_init_params_and_meshes_of_the_wrong_kind_are_named():
    assert TINY.replace(compute_dtype=jnp.bfloat16).compute_dtype == "bfloat16"
    for rng in (0, None, jax.random.split(jax.random.key(0), 2)):
        with pytest.raises(TypeError, match=r"rng must be one JAX random key, e\.g\. jax\.random\.key\(0\)"):
            init_params(TINY, rng)
    with pytest.raises(TypeError, match=r"the order is init_params\(cfg, rng\)"):
        init_params(jax.random.key(0), TINY)
    with pytest.raises(ValueError, match="std must be a number >= 0, got nan"):
        init_params(TINY, jax.random.key(0), std=float("nan"))
    with pytest.raises(TypeError, match=r"mesh must be None \(one device\) or a jax Mesh"):
        init_params(TINY, jax.random.key(0), mesh="cpu")
    with pytest.raises(ValueError, match="unknown sharding rules 'bogus'"):  # also without a mesh
        init_params(TINY, jax.random.key(0), rules="bogus")


def test_save_pretrained_refuses_before_writing_a_weight(params, tmp_path):
    """A file as the folder was the OS's FileExistsError; extra_config over the model's own keys wrote a
    checkpoint that does not load; a value JSON cannot hold failed after every tensor was written."""
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="afile is a file; save_pretrained writes a folder"):
        save_pretrained(TINY, params, tmp_path / "afile")
    with pytest.raises(ValueError, match="extra_config sets hidden_size, which describe the model"):
        save_pretrained(TINY, params, tmp_path / "a", extra_config={"hidden_size": 7})
    with pytest.raises(ValueError, match="holds a value JSON cannot write"):
        save_pretrained(TINY, params, tmp_path / "b", generation_config={"eos_token_id": {1, 2}})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    out = save_pretrained(TINY, params, tmp_path / "c", extra_config={"hidden_size": TINY.hidden_size, "note": 1})
    assert load_pretrained(out)[0].hidden_size == TINY.hidden_size
    # Weights holding NaN or Inf (on the device, or as NumPy arrays) are named, and the earlier save is kept.
    written = {f.name: f.read_bytes() for f in out.iterdir()}
    for broken in (jax.tree.map(lambda x: x, params), jax.tree.map(np.asarray, params)):
        broken["final_norm"] = broken["final_norm"].at[0].set(np.nan) if isinstance(broken["final_norm"], jax.Array) \
            else np.where(np.arange(broken["final_norm"].size) == 0, np.inf, broken["final_norm"])
        with pytest.raises(ValueError, match=r"1 parameter array\(s\) hold NaN or Inf \(first model.norm.weight\)"):
            save_pretrained(TINY, broken, out)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == written
