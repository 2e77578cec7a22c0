"""Hugging Face checkpoints in and out (config.json + safetensors, single file or sharded index).

Loading never holds the whole model on a host: each device's shard is read straight from a
safetensors slice (`jax.make_array_from_callback`), so every host of a pod reads only its part.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open

from spiral_jax.models.config import CheckpointError, ModelConfig, float_dtype
from spiral_jax.models.lora import adapter_specs
from spiral_jax.models.params import (ParamSpec, hf_shape, hf_slice, hf_tensor, is_spec, layer_spec,
                                      param_specs)
from spiral_jax.sharding import Rules

# Tensors some checkpoints carry that the model does not need.
_IGNORED = re.compile(r"(.*rotary_emb\.inv_freq$)")
# Safetensors dtypes a model's weights can be stored in; integer or 8-bit tensors of the right shape
# are quantized or not weights at all, and would load as garbage.
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def _open_safetensors(file: Path):
    try:
        return safe_open(file, "np")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} is not a readable safetensors file ({e}); it is probably a partial "
                              f"download or copy: download or export the checkpoint again") from None


class _SafetensorsReader:
    """Name -> file lookup over one or many safetensors files, with lazily opened handles."""

    def __init__(self, path: Path):
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        if single.exists():  # before an index, as transformers reads a folder that has both
            self.files = {name: single for name in _open_safetensors(single).keys()}
        elif index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                self.files = {str(name): path / f for name, f in weight_map.items()}
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{index} is malformed ({e!r}); it needs a 'weight_map' of tensor "
                                      f"names to file names") from None
        else:
            raise CheckpointError(
                f"no model.safetensors or model.safetensors.index.json in {path}; spiral_jax reads "
                f"safetensors checkpoints (convert a .bin checkpoint with transformers' save_pretrained)")
        missing_files = sorted({str(f) for f in self.files.values() if not f.exists()})
        if missing_files:
            raise CheckpointError(f"checkpoint index names files that do not exist: {missing_files}")
        self._handles = {}

    def _open(self, name: str):
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = _open_safetensors(file)
        return self._handles[file]

    def _slice(self, name: str):
        """The tensor's lazy slice; a CheckpointError where its file does not hold it (an index from
        another download than its shards)."""
        try:
            return self._open(name).get_slice(name)
        except SafetensorError:
            raise CheckpointError(f"model.safetensors.index.json maps {name} to {self.files[name].name}, which "
                                  f"does not hold it: the index and the shards come from different downloads; "
                                  f"download the checkpoint again") from None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._slice(name).get_dtype()

    def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """A slice of a tensor, which must be finite: NaN or infinite weights (a diverged run's export,
        a corrupt file) would otherwise surface only as NaN logits at the first sampling step."""
        x = self._slice(name)[index]
        if not np.isfinite(x).all():
            raise CheckpointError(f"tensor {name} in {self.files[name]} holds NaN or infinite values: the "
                                  f"checkpoint is corrupt or was saved from a diverged run; load an earlier "
                                  f"or freshly downloaded checkpoint")
        return x


def _per_layer(cfg: ModelConfig, spec: ParamSpec) -> list[ParamSpec]:
    """The HF tensors behind one spec: one per layer for per-layer weights."""
    if "{i}" in spec.hf_name:
        return [layer_spec(spec, i) for i in range(cfg.num_layers)]
    return [spec]


def _check_tied_copy(reader: _SafetensorsReader) -> None:
    """A tied checkpoint's lm_head.weight must be a copy of the embedding (a few rows are compared):
    one of its own is read by transformers and dropped by vLLM, so the model would have two meanings."""
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    rows = reader.shape(head)[0] if reader.shape(head) == reader.shape(embed) else 0
    if not rows or any((reader.read(head, (slice(r, r + 1),)) != reader.read(embed, (slice(r, r + 1),))).any()
                       for r in sorted({0, rows // 2, rows - 1})):
        raise CheckpointError(
            f"config.json has tie_word_embeddings=true, but the checkpoint's {head} is not a copy of {embed}; "
            f"set tie_word_embeddings=false in config.json if the model has its own LM head, else delete {head}")


def _check_tensors(cfg: ModelConfig, reader: _SafetensorsReader, specs) -> None:
    expected = {s.hf_name: hf_shape(s) for spec in jax.tree.leaves(specs, is_leaf=is_spec)
                for s in _per_layer(cfg, spec)}
    present = {n for n in reader.files if not _IGNORED.match(n)}
    if cfg.tie_word_embeddings and "lm_head.weight" in present:
        if "model.embed_tokens.weight" in present:  # else reported missing below
            _check_tied_copy(reader)
        present.discard("lm_head.weight")  # some tied checkpoints store the shared matrix twice
    missing, extra = sorted(set(expected) - present), sorted(present - set(expected))
    if missing:
        hint = (" (an untied model needs lm_head.weight; set tie_word_embeddings=true in config.json "
                "if the checkpoint shares it with the embedding)" if "lm_head.weight" in missing else "")
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensor(s): {missing[:8]}{hint}")
    if extra:
        raise CheckpointError(
            f"checkpoint has {len(extra)} tensor(s) this {cfg.model_type} config does not use: "
            f"{extra[:8]}; does config.json match the weights (model_type, layers, bias, q/k norm)?")
    for name, shape in expected.items():
        got = reader.shape(name)
        if got != shape:
            raise CheckpointError(f"tensor {name} has shape {list(got)} but the config implies "
                                  f"{list(shape)}; config.json does not match the weights")
        if reader.dtype(name) not in _FLOAT_DTYPES:
            raise CheckpointError(
                f"tensor {name} is stored as {reader.dtype(name)}, and spiral_jax reads weights stored as "
                f"{', '.join(_FLOAT_DTYPES)}; a quantized checkpoint needs dequantizing first (load it in "
                f"transformers and save_pretrained it in bfloat16)")


def load_pretrained(path, mesh=None, dtype=jnp.float32, rules: str = "train", **runtime):
    """(ModelConfig, params) from a HF checkpoint folder, each array built directly in its sharding.

    `runtime` sets ModelConfig's runtime fields (compute_dtype, scan_layers, remat).
    """
    dtype = jnp.float32 if dtype is None else float_dtype("dtype", dtype)
    path = Path(path)
    cfg = ModelConfig.from_pretrained(path, **runtime)  # a CheckpointError unless `path` is a checkpoint folder
    reader = _SafetensorsReader(path)
    specs = param_specs(cfg)
    _check_tensors(cfg, reader, specs)
    shard_rules = Rules.create(mesh, rules)
    if shard_rules is None:
        shard_rules = Rules.create(jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1),
                                                     ("data", "fsdp", "tensor")), rules)

    def build(spec: ParamSpec):
        sharding = shard_rules.sharding(spec.axes, spec.shape)

        def callback(index):
            index = tuple(index) + (slice(None),) * (len(spec.shape) - len(index))
            if "{i}" in spec.hf_name:  # stacked layers: read each layer of the slice
                layers = range(*index[0].indices(spec.shape[0]))
                x = np.stack([hf_slice(layer_spec(spec, i), reader.read, index[1:]) for i in layers])
            else:
                x = hf_slice(spec, reader.read, index)
            return x.astype(dtype)

        return jax.make_array_from_callback(spec.shape, sharding, callback)

    return cfg, jax.tree.map(build, specs, is_leaf=is_spec)


@dataclasses.dataclass
class _Tensor:
    """One tensor of an export: its HF name and shape, and how to make it (when it is written)."""

    name: str
    shape: tuple[int, ...]
    itemsize: int
    make: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.itemsize


def _hf_array(spec: ParamSpec, value, layer: int | None, dtype) -> np.ndarray:
    """One HF tensor from our array (one layer of a stacked one), in the export's dtype."""
    ours = value if layer is None else value[layer]
    return hf_tensor(spec, np.asarray(jax.device_get(ours), np.float32)).astype(dtype)


def _finite(value) -> bool:
    """No NaN or Inf in `value`, reduced where it lives (a device array is not copied to the host)."""
    return bool(jnp.isfinite(value).all()) if isinstance(value, jax.Array) else bool(np.isfinite(value).all())


def _tensors(cfg: ModelConfig, specs, params, np_dtype) -> list[_Tensor]:
    """The HF tensors of `params` (a tree shaped like `specs`), one per layer of a stacked array,
    each made in `np_dtype` only when it is written. Checked first, before a file is touched: the
    shapes, and that no array holds NaN or Inf (a model saved with them answers NaN wherever it loads)."""
    flat_specs, flat_params = jax.tree.leaves(specs, is_leaf=is_spec), jax.tree.leaves(params)
    if len(flat_specs) != len(flat_params):
        raise ValueError(f"params do not match the config: {len(flat_params)} arrays, "
                         f"expected {len(flat_specs)} for this {cfg.model_type} config")
    for spec, value in zip(flat_specs, flat_params):
        if tuple(value.shape) != tuple(spec.shape):
            raise ValueError(f"{spec.hf_name}: array shape {list(value.shape)} != {list(spec.shape)}")
    if bad := [spec.hf_name for spec, value in zip(flat_specs, flat_params) if not _finite(value)]:
        raise ValueError(f"{len(bad)} parameter array(s) hold NaN or Inf (first {bad[0]}), so the saved model would "
                         f"answer NaN; save finite weights (of a run: an earlier checkpoint, with spiral-jax export --step N)")
    tensors = []
    for spec, value in zip(flat_specs, flat_params):
        stacked = "{i}" in spec.hf_name
        for i, s in enumerate(_per_layer(cfg, spec)):
            make = functools.partial(_hf_array, s, value, i if stacked else None, np_dtype)
            tensors.append(_Tensor(s.hf_name, hf_shape(s), np.dtype(np_dtype).itemsize, make))
    return tensors


def _write_safetensors(path: Path, tensors: list[_Tensor], dtype: str) -> None:
    """A safetensors file written tensor by tensor. The format is an 8-byte little-endian header
    length, a JSON header (each tensor's dtype, shape and byte range in the data; padded with spaces to
    a multiple of 8) and the tensors' bytes in that order. The header needs only the shapes, so each
    tensor is made just before it is written and dropped after."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for t in tensors:
        header[t.name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(len(blob).to_bytes(8, "little"))
        f.write(blob)
        for t in tensors:
            array = np.ascontiguousarray(t.make())
            if array.shape != t.shape or array.nbytes != t.nbytes:
                raise ValueError(f"{t.name}: made {array.shape} ({array.nbytes} bytes), expected {t.shape}")
            f.write(array.reshape(-1).view(np.uint8).data)  # raw bytes (bf16 has no buffer format)


def save_pretrained(cfg: ModelConfig, params, path, extra_config: dict | None = None, dtype: str = "float32",
                    max_shard_bytes: int = 5 * 2**30, generation_config: dict | None = None) -> Path:
    """Write config.json and safetensors in the layout transformers and vLLM load.

    dtype: "float32" or "bfloat16" for the stored tensors (config.json's torch_dtype says which).
    Above `max_shard_bytes` the tensors go to model-00001-of-0000N.safetensors files with a
    model.safetensors.index.json, as Hugging Face shards them; below, one model.safetensors.
    generation_config: written to generation_config.json when given (e.g. the EOS ids to stop at).
    Files of an earlier save in `path` that the new one does not write are removed, so no loader
    mixes the two. Tensors are converted and written one at a time (`_write_safetensors`): besides the
    parameters themselves, the export holds one tensor in memory, not a second copy of the model."""
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r}; export float32 or bfloat16")
    import ml_dtypes

    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    path = Path(path)
    hf = cfg.to_hf_dict()
    if clash := sorted(k for k in extra_config or {} if k in hf and extra_config[k] != hf[k]):
        raise ValueError(f"extra_config sets {', '.join(clash)}, which describe the model and come from cfg; "
                         f"change cfg instead (dataclasses.replace) or leave them out")
    hf.update(extra_config or {}, torch_dtype=dtype)
    try:  # before any weight is written: a value JSON cannot hold fails here, not after the tensors
        texts = {"config.json": json.dumps(hf, indent=2) + "\n"}
        if generation_config is not None:
            texts["generation_config.json"] = json.dumps(generation_config, indent=2) + "\n"
    except (TypeError, ValueError) as e:
        raise ValueError(f"extra_config or generation_config holds a value JSON cannot write: {e}") from None
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file; save_pretrained writes a folder: give a folder's path")
    path.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(cfg, param_specs(cfg), params, np_dtype)
    shards: list[list[_Tensor]] = [[]]
    for tensor in tensors:
        if shards[-1] and sum(t.nbytes for t in shards[-1]) + tensor.nbytes > max_shard_bytes:
            shards.append([])
        shards[-1].append(tensor)
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
    for stale in [*path.glob("model*.safetensors"), path / "model.safetensors.index.json"]:
        if stale.name not in names:
            stale.unlink(missing_ok=True)
    written = list(names)
    for name, shard in zip(names, shards):
        tmp = path / f"{name}.tmp"
        _write_safetensors(tmp, shard, "F32" if dtype == "float32" else "BF16")
        tmp.replace(path / name)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)},
                 "weight_map": {t.name: name for name, shard in zip(names, shards) for t in shard}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
        written.append("model.safetensors.index.json")
    for name, text in texts.items():
        (path / name).write_text(text)
        written.append(name)
    for name in written:
        (path / name).chmod(0o644)  # readable by the serving user, like any model download
    return path


_PEFT_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
                 "down": "down_proj"}


def save_adapter(cfg: ModelConfig, adapters, path, base_model: str = "") -> Path:
    """Write LoRA adapters as a PEFT adapter folder (adapter_config.json, adapter_model.safetensors, fp32),
    which `peft.PeftModel.from_pretrained` and vLLM load on top of the base model. adapters: the LoRA
    leaves (`lora.split(params)[1]`); base_model: recorded as base_model_name_or_path."""
    if not cfg.lora_rank:
        raise ValueError("save_adapter needs a LoRA model config (lora_rank > 0)")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(cfg, adapter_specs(cfg), adapters, np.float32)
    tmp = path / "adapter_model.safetensors.tmp"
    _write_safetensors(tmp, tensors, "F32")
    tmp.replace(path / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": cfg.lora_rank, "lora_alpha": cfg.lora_alpha,
              "target_modules": [_PEFT_MODULES[t] for t in cfg.lora_targets], "lora_dropout": 0.0, "bias": "none",
              "base_model_name_or_path": base_model, "fan_in_fan_out": False, "inference_mode": True,
              "use_rslora": False, "use_dora": False, "init_lora_weights": True, "modules_to_save": None}
    (path / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (path / name).chmod(0o644)
    return path


def load_policy_weights(source: str, cfg, mesh):
    """An HF folder's weights in the sampler layout on `mesh`, checked to have `cfg`'s architecture
    (model opponents and cross-play players run through the same sampler program)."""
    other, params = load_pretrained(source, mesh=mesh, rules="sample", compute_dtype=cfg.compute_dtype,
                                    scan_layers=cfg.scan_layers, remat=cfg.remat, remat_saves=cfg.remat_saves,
                                    attention=cfg.attention, decode_attention=cfg.decode_attention)
    if cfg.architecture_differences(other):
        raise ValueError(f"{source} has another architecture than the evaluated model; "
                         "cross-play and model opponents need the same one")
    return params
