"""save_pretrained / load_pretrained round trips, and every checkpoint error names its fix."""
import json
import re
import shutil

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from spiral_jax.models import CheckpointError, ModelConfig, forward, init_params, load_pretrained, save_pretrained
from spiral_jax.sharding import MeshError, make_mesh
from tests.models.test_hf_parity import _padded_batch, _torch_logits


@pytest.mark.parametrize("scan_layers", [False, True])
def test_round_trip_is_exact_and_transformers_loads_it(hf_model, tmp_path, scan_layers):
    _, path, model = hf_model
    cfg, params = load_pretrained(path, scan_layers=scan_layers)
    save_pretrained(cfg, params, tmp_path)
    cfg2, params2 = load_pretrained(tmp_path, scan_layers=scan_layers)
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Bit-identical tensors to what transformers wrote in the first place.
    original, ours = load_file(path / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert set(ours) == set(original) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set())
    for name, value in ours.items():
        np.testing.assert_array_equal(value, original[name])

    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids, mask = _padded_batch(cfg.vocab_size, [40, 64], 64)
    ours_logits = np.asarray(forward(params, cfg, ids, mask))
    valid = mask.astype(bool)  # padding positions hold arbitrary values in both
    np.testing.assert_allclose(_torch_logits(reloaded, ids, mask)[valid], ours_logits[valid], atol=1e-4)


def test_sharded_index_checkpoint(hf_model, tmp_path):
    """A checkpoint split over several files with model.safetensors.index.json loads the same."""
    _, path, _ = hf_model
    tensors = load_file(path / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for part, chunk in enumerate([names[::2], names[1::2]]):
        file = f"model-0000{part + 1}-of-00002.safetensors"
        save_file({n: tensors[n] for n in chunk}, tmp_path / file)
        weight_map.update({n: file for n in chunk})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    shutil.copy(path / "config.json", tmp_path / "config.json")
    _, a = load_pretrained(path)
    _, b = load_pretrained(tmp_path, mesh=make_mesh(data=2, fsdp=2, tensor=2))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_folder_with_a_single_file_and_an_index_reads_the_single_file(hf_model, tmp_path):
    """As transformers does; a malformed index is a CheckpointError, whatever its JSON holds."""
    _, path, _ = hf_model
    shutil.copy(path / "config.json", tmp_path / "config.json")
    tensors = load_file(path / "model.safetensors")
    save_file({n: t * 2 for n, t in tensors.items()}, tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: "gone.safetensors"
                                                                                   for n in tensors}}))
    _, a = load_pretrained(path)
    _, b = load_pretrained(tmp_path)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(2 * np.asarray(x), np.asarray(y))
    (tmp_path / "model.safetensors").unlink()
    for index in ({"weight_map": list(tensors)}, [1, 2], {"weights": {}}):
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
        with pytest.raises(CheckpointError, match="is malformed .* needs a 'weight_map'"):
            load_pretrained(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_bytes(b"\xff\xfe{}")  # not UTF-8
    with pytest.raises(CheckpointError, match="is malformed .* needs a 'weight_map'"):
        load_pretrained(tmp_path)


def test_an_index_that_maps_a_tensor_to_the_wrong_shard_is_named(hf_model, tmp_path):
    """An index from another download than its shards: the shard it names lacks the tensor."""
    _, path, _ = hf_model
    shutil.copy(path / "config.json", tmp_path / "config.json")
    tensors = load_file(path / "model.safetensors")
    names = sorted(tensors)
    for part, chunk in enumerate([names[::2], names[1::2]]):
        save_file({n: tensors[n] for n in chunk}, tmp_path / f"model-0000{part + 1}-of-00002.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: "model-00001-of-00002.safetensors" for n in names}}))
    with pytest.raises(CheckpointError, match=r"index.json maps model\.\S+ to model-00001-of-00002.safetensors, "
                                              r"which does not hold it.*download the checkpoint again"):
        load_pretrained(tmp_path)


def test_config_reads_transformers_4x_spelling():
    hf4 = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "rope_theta": 500000.0, "torch_dtype": "bfloat16",
           "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    hf5 = {**hf4, "dtype": "bfloat16", "rope_parameters": {"rope_theta": 500000.0, **hf4["rope_scaling"],
                                                            "rope_type": "llama3"}}
    del hf5["rope_theta"], hf5["rope_scaling"], hf5["torch_dtype"], hf5["rope_parameters"]["type"]
    a, b = ModelConfig.from_hf_dict(hf4), ModelConfig.from_hf_dict(hf5)
    assert a == b
    assert a.rope_theta == 500000.0 and a.rope_scaling.factor == 8.0 and a.head_dim == 4


# ------------------------------------------------------------------------------------------ errors

def _copy(path, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(path, dst)
    return dst


def test_missing_folder_and_config(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_pretrained(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_pretrained(tmp_path)


def test_an_adapter_folder_or_a_run_given_for_a_model_is_named(tmp_path):
    """A PEFT adapter folder (a LoRA run's `export --adapter`) was "no config.json", a run's out_dir
    (its config.json is the run's) "has no 'model_type'", as an opponent or model.path."""
    adapter, run = tmp_path / "adapter", tmp_path / "run"
    (adapter).mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (run / "checkpoints" / "3").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model": {"path": ""}}))
    (run / "checkpoints" / "3" / "_CHECKPOINT_METADATA").write_text("{}")
    with pytest.raises(CheckpointError, match=r"is a PEFT adapter folder \(adapter_config.json\), not a model; give "
                                              r"a folder of merged weights \(`spiral-jax export` without --adapter"):
        load_pretrained(adapter)
    for folder in (run, run / "checkpoints" / "3"):
        with pytest.raises(CheckpointError, match=rf"{folder} is a spiral-jax run's out_dir or checkpoint, not a "
                                                  rf"Hugging Face folder; write it as one with `spiral-jax export"):
            ModelConfig.from_pretrained(folder)


def test_a_file_of_the_checkpoint_given_for_its_folder_is_named(hf_model):
    """model.path=.../model.safetensors was "not valid JSON; re-download it", .../config.json passed the
    run's setup and then "does not exist"."""
    path = hf_model[1]
    for file in (path / "model.safetensors", path / "config.json"):
        for load in (load_pretrained, ModelConfig.from_pretrained):
            with pytest.raises(CheckpointError, match=rf"{file} is a file; give the checkpoint folder that holds "
                                                      rf"config.json and the weights \({path}\)"):
                load(file)


def test_malformed_config(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_pretrained(ckpt)
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": 3}))
    with pytest.raises(CheckpointError, match="missing the required field 'hidden_size'"):
        load_pretrained(ckpt)


def test_a_config_json_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(CheckpointError, match=r"config.json cannot be read \(Is a directory\)"):
        load_pretrained(tmp_path)


def test_a_tied_config_over_an_lm_head_of_its_own_is_refused(tmp_path):
    """tie_word_embeddings=true over a checkpoint whose lm_head.weight is not the embedding's copy:
    transformers reads the head, vLLM drops it, and spiral_jax dropped it without a word."""
    from tests.tiny_models import make_hf_model

    make_hf_model("qwen2", tmp_path)  # untied
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with pytest.raises(CheckpointError, match="tie_word_embeddings=true, but the checkpoint's lm_head.weight is "
                                              "not a copy of model.embed_tokens.weight; set tie_word_embeddings=false"):
        load_pretrained(tmp_path)
    _rewrite_tensors(tmp_path, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].copy()}))
    cfg, params = load_pretrained(tmp_path)  # a tied checkpoint that stores the shared matrix twice
    assert cfg.tie_word_embeddings and "lm_head" not in params


def test_unsupported_model_type(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="unsupported model_type 'gpt2'.*qwen2, qwen3, llama"):
        load_pretrained(ckpt)


def test_a_sliding_window_or_another_activation_is_refused(tmp_path):
    """Layers that attend over a sliding window shorter than the context (here layer 1 of 2, over 8
    tokens) give other logits past the window, as do activations other than SwiGLU's: both are refused,
    in transformers 5's spelling (`layer_types`, as saved) and 4's (`use_sliding_window`)."""
    from tests.tiny_models import make_hf_model

    make_hf_model("qwen2", tmp_path, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    with pytest.raises(CheckpointError, match=r"1 layer\(s\) \(from layer 1\) attending over a sliding window "
                                              r"of 8 tokens"):
        load_pretrained(tmp_path)
    hf = {"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 4, "num_attention_heads": 2, "max_position_embeddings": 4096}
    with pytest.raises(CheckpointError, match=r"3 layer\(s\) \(from layer 1\).*window of 1024 tokens"):
        ModelConfig.from_hf_dict({**hf, "use_sliding_window": True, "sliding_window": 1024, "max_window_layers": 1})
    # Off, or a window that holds every position: full attention, as Qwen2.5's released configs have.
    ModelConfig.from_hf_dict({**hf, "use_sliding_window": False, "sliding_window": 1024, "max_window_layers": 1})
    ModelConfig.from_hf_dict({**hf, "layer_types": ["sliding_attention"] * 4, "sliding_window": 4096})
    ModelConfig.from_hf_dict({**hf, "layer_types": ["full_attention"] * 4, "sliding_window": None})
    with pytest.raises(CheckpointError, match="hidden_act='gelu'"):
        ModelConfig.from_hf_dict({**hf, "hidden_act": "gelu"})


def test_config_values_are_read_as_transformers_reads_them_or_named_when_malformed():
    hf = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2}
    assert ModelConfig.from_hf_dict(hf).max_position_embeddings == 2048  # LlamaConfig's default
    assert ModelConfig.from_hf_dict({**hf, "model_type": "qwen3"}).max_position_embeddings == 32768
    # transformers 5 reads rope_parameters' theta before a top-level one left by a hand edit.
    both = {**hf, "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    assert ModelConfig.from_hf_dict(both).rope_theta == 1e6
    llama3 = {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    for bad, message in [({"rope_theta": None}, "rope_theta=None; it must be a number"),
                         ({"hidden_size": "eight"}, "hidden_size='eight'; it must be an integer"),
                         ({"rope_scaling": llama3}, "rope_scaling is missing the required field 'low_freq_factor'"),
                         ({"mlp_bias": True}, "mlp_bias=true; spiral_jax's MLP has no biases")]:
        with pytest.raises(CheckpointError, match=re.escape(message)):
            ModelConfig.from_hf_dict({**hf, **bad})


@pytest.mark.parametrize("bad, message", [
    # Sizes that are no whole positive number: int(64.5) read another model, 0 heads divided by zero.
    ({"hidden_size": 8.5}, "hidden_size=8.5; it must be an integer"),
    ({"vocab_size": float("inf")}, "vocab_size=inf; it must be an integer"),
    ({"num_attention_heads": 0}, "num_attention_heads=0; it must be above 0"),
    ({"num_key_value_heads": 0}, "num_key_value_heads=0; it must be above 0"),
    ({"num_hidden_layers": -2}, "num_hidden_layers=-2; it must be above 0"),
    ({"head_dim": 0}, "head_dim=0; it must be above 0"),
    # Floats that give NaN logits.
    ({"rope_theta": float("nan")}, "rope_theta=nan; it must be a number"),
    ({"rope_theta": 0}, "rope_theta=0; it must be above 0"),
    ({"rms_norm_eps": -1e-6}, "rms_norm_eps=-1e-06; it must be at least 0"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 0, "low_freq_factor": 1, "high_freq_factor": 4,
                       "original_max_position_embeddings": 64}}, "rope_scaling has factor=0; it must be above 0"),
    # A string read as true tied an untied model to its embedding.
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings='false'; it must be true or false"),
    ({"attention_bias": "false"}, "attention_bias='false'; it must be true or false"),
    ({"eos_token_id": "</s>"}, "eos_token_id='</s>'; it must be a token id (an integer >= 0), a list of them or null"),
    ({"eos_token_id": [2, None]}, "eos_token_id=[2, None]; it must be a token id"),
    ({"bos_token_id": [1, 2]}, "bos_token_id=[1, 2]; it must be a token id (an integer >= 0) or null"),
    ({"rope_scaling": [8.0]}, "rope_scaling=[8.0]; it must be an object of RoPE settings"),
    ({"rope_parameters": "default"}, "rope_parameters='default'; it must be an object of RoPE settings"),
    ({"layer_types": "full_attention"}, "layer_types='full_attention'; it must be a list"),
    ({"layer_types": ["full_attention"] * 2}, "layer_types=['full_attention', 'full_attention']; it must be a list "
     "with one attention type per layer (1)"),
    ({"use_sliding_window": True, "sliding_window": "4k"}, "sliding_window='4k'; it must be an integer"),
    ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": None},
     "max_window_layers=None; it must be an integer"),
    ({"architectures": ["LlamaForSequenceClassification"]},
     "architectures=['LlamaForSequenceClassification'], not a causal language model"),
])
def test_a_config_value_of_the_wrong_kind_is_named_not_a_traceback_or_a_silent_guess(bad, message):
    """Every malformed value of config.json is a CheckpointError naming the key, not a TypeError,
    ZeroDivisionError or OverflowError from deep inside, nor a value read as something else."""
    hf = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2, "architectures": ["LlamaForCausalLM"]}
    with pytest.raises(CheckpointError, match=re.escape(message)):
        ModelConfig.from_hf_dict({**hf, **bad})
    # The well-formed spellings of the same keys still read.
    ok = ModelConfig.from_hf_dict({**hf, "hidden_size": 8.0, "rms_norm_eps": 0, "sliding_window": None,
                                   "tie_word_embeddings": None, "eos_token_id": [2, 3], "bos_token_id": 1})
    assert ok.hidden_size == 8 and ok.eos_token_id == (2, 3) and not ok.tie_word_embeddings


def test_a_quantized_checkpoint_is_refused_before_its_tensors_are_read():
    hf = {"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2,
          "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}
    with pytest.raises(CheckpointError, match=r"quantization_config \(fp8\).*use the model's bf16 checkpoint"):
        ModelConfig.from_hf_dict(hf)


def _rewrite_tensors(ckpt, edit):
    tensors = load_file(ckpt / "model.safetensors")
    edit(tensors)
    save_file(tensors, ckpt / "model.safetensors")


def test_missing_tensor(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    _rewrite_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*model\.layers\.1\.mlp\.up_proj\.weight"):
        load_pretrained(ckpt)


def test_extra_tensor(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    _rewrite_tensors(ckpt, lambda t: t.update({"model.layers.7.foo.weight": np.zeros(3, np.float32)}))
    with pytest.raises(CheckpointError, match=r"does not use: \['model\.layers\.7\.foo\.weight'\]"):
        load_pretrained(ckpt)


def test_shape_mismatch(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    _rewrite_tensors(ckpt, lambda t: t.update({name: np.zeros((64, 95), np.float32)}))
    with pytest.raises(CheckpointError, match=rf"{name} has shape \[64, 95\] but the config implies \[64, 96\]"):
        load_pretrained(ckpt)


def test_integer_weights(hf_model, tmp_path):
    """A tensor of the right shape stored as integers (a quantized export) is refused, not cast."""
    ckpt = _copy(hf_model[1], tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite_tensors(ckpt, lambda t: t.update({name: t[name].astype(np.int32)}))
    with pytest.raises(CheckpointError, match=rf"{name} is stored as I32.*dequantizing"):
        load_pretrained(ckpt)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights(hf_model, tmp_path, bad):
    """NaN or infinite weights are named at load time, in a stacked layer too, not found as NaN
    logits at the first sampling step."""
    ckpt = _copy(hf_model[1], tmp_path)
    name = "model.layers.1.self_attn.o_proj.weight"

    def poison(t):
        t[name] = t[name].copy()
        t[name][3, 5] = bad
    _rewrite_tensors(ckpt, poison)
    for scan_layers in (False, True):
        with pytest.raises(CheckpointError, match=rf"{name} in .*model.safetensors holds NaN or infinite"):
            load_pretrained(ckpt, scan_layers=scan_layers)


def test_missing_weights_file(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_pretrained(ckpt)


def test_truncated_or_damaged_weights_file(hf_model, tmp_path):
    ckpt = _copy(hf_model[1], tmp_path)
    weights = ckpt / "model.safetensors"
    data = weights.read_bytes()
    for damaged in (data[:len(data) // 2], b"\xff" * 16 + data[16:], b""):
        weights.write_bytes(damaged)
        with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors file.*again"):
            load_pretrained(ckpt)


def test_mesh_that_does_not_fit():
    with pytest.raises(MeshError, match="does not fit 8 devices"):
        make_mesh(data=3, fsdp=-1)
    with pytest.raises(MeshError, match="multiply to 8"):
        make_mesh(data=2, fsdp=2, tensor=1)
    assert make_mesh(data=2, fsdp=-1, tensor=2).shape == {"data": 2, "fsdp": 2, "tensor": 2}


def test_init_params_shapes():
    cfg = ModelConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3,
                      num_heads=4, num_kv_heads=2, head_dim=8, scan_layers=True)
    params = init_params(cfg, jax.random.key(0))
    assert params["layers"]["q"].shape == (3, 4, 8, 32)  # [layers, heads, head_dim, embed]: out-major like HF
    assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params
