"""ModelConfig: the architecture of a Qwen2/2.5, Qwen3 or Llama 3.x decoder, read from a HF config.json.

transformers 4.x and 5.x spell some fields differently (5.x nests RoPE settings under
`rope_parameters` and writes `dtype` instead of `torch_dtype`); both are accepted here so the rest of
the package sees one shape.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


# The projections LoRA adapters may sit on (spiral_jax/models/lora.py).
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
# What a rematerialised layer may keep from its forward for the backward, instead of computing it
# again (`ModelConfig.remat_saves`): the q/k/v projections' outputs, or the MLP's gate and up.
REMAT_SAVES = ("qkv", "mlp")


class CheckpointError(ValueError):
    """A checkpoint folder or config that cannot be used, with a message saying how to fix it."""


def read_json_object(file: Path) -> dict[str, Any]:
    """A checkpoint's JSON file (config.json, generation_config.json) as a dict; a CheckpointError
    naming the file when it cannot be read or is not a JSON object."""
    try:
        value = json.loads(Path(file).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file} is not valid JSON ({e}); re-download or re-export it") from None
    except OSError as e:  # a folder of that name, no read permission
        raise CheckpointError(f"{file} cannot be read ({e.strerror}); it must be a readable JSON file") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file} must hold a JSON object, got {type(value).__name__}")
    return value


# transformers' max_position_embeddings where a config.json leaves it out, by family: it bounds the
# sampler's cache, which a shape check of the weights cannot catch.
_MAX_POSITIONS = {"qwen2": 32768, "qwen3": 32768, "llama": 2048}
# null means "as many as the heads", "hidden / heads", "no window"
_NULLABLE = ("num_key_value_heads", "head_dim", "sliding_window")
_REQUIRED = object()


def _number(hf: dict[str, Any], key: str, default: Any = _REQUIRED, kind=int, where: str = "config.json",
            zero: bool = False):
    """hf[key] as a finite number of `kind`, above zero (or at least zero, with `zero`); `default` where
    the key is absent (or null, for `_NULLABLE`). A missing required key, or a value that is no such
    number (a fractional size, NaN, a negative RoPE base), is a CheckpointError naming the key: a size
    read as int(64.5), or rope_theta=NaN, would give another model or NaN logits, not an error."""
    value = hf.get(key)
    if value is None and default is not _REQUIRED and (key not in hf or key in _NULLABLE):
        return default
    if key not in hf:
        raise CheckpointError(f"{where} is missing the required field {key!r}")
    try:
        if isinstance(value, bool):
            raise TypeError(key)
        number = float(value)
        if not math.isfinite(number) or (kind is int and not number.is_integer()):
            raise ValueError(key)
        number = int(value) if kind is int and isinstance(value, int) else kind(number)
    except (TypeError, ValueError):
        noun = "an integer" if kind is int else "a number"
        raise CheckpointError(f"{where} has {key}={value!r}; it must be {noun}") from None
    if number < 0 or (number == 0 and not zero):
        raise CheckpointError(f"{where} has {key}={value!r}; it must be {'at least' if zero else 'above'} 0")
    return number


def _flag(hf: dict[str, Any], key: str) -> bool:
    """hf[key] as a bool (false where absent or null): a string such as "false" is refused, not read as
    true (tie_word_embeddings="false" would drop the checkpoint's lm_head.weight for the embedding)."""
    value = hf.get(key)
    if value is not None and not isinstance(value, bool):
        raise CheckpointError(f"config.json has {key}={value!r}; it must be true or false")
    return bool(value)


def token_ids(hf: dict[str, Any], key: str, where: str = "config.json", many: bool = True):
    """hf[key] as a token id, with `many` a tuple of them (from a list), or None: anything else (a
    string, a float, a negative id) would surface as a TypeError or an id no sampled token can match."""
    value = hf.get(key)
    ids = value if many and isinstance(value, list) else [value]
    if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CheckpointError(f"{where} has {key}={value!r}; it must be a token id (an integer >= 0)"
                              f"{', a list of them' if many else ''} or null")
    return tuple(value) if isinstance(value, list) else value


def _check_full_attention(hf: dict[str, Any], num_layers: int, max_positions: int) -> None:
    """Refuse a checkpoint with layers that attend over a sliding window (transformers' `layer_types`,
    or Qwen2/Qwen3's `use_sliding_window` from layer `max_window_layers` on): every layer here attends
    to all earlier positions, so past the window its logits would differ from the model's. A window
    that holds every position is full attention and passes."""
    window = _number(hf, "sliding_window", None, zero=True)
    if hf.get("layer_types") is not None:
        if not isinstance(hf["layer_types"], list) or len(hf["layer_types"]) != num_layers:
            raise CheckpointError(f"config.json has layer_types={hf['layer_types']!r}; it must be a list with "
                                  f"one attention type per layer ({num_layers}), such as \"full_attention\"")
        sliding = [i for i, kind in enumerate(hf["layer_types"]) if kind != "full_attention"]
    elif _flag(hf, "use_sliding_window") and window is not None:
        sliding = list(range(_number(hf, "max_window_layers", 0, zero=True), num_layers))
    else:
        sliding = []
    if sliding and (window is None or window < max_positions):
        raise CheckpointError(
            f"config.json has {len(sliding)} layer(s) (from layer {sliding[0]}) attending over a sliding window "
            f"of {window} tokens (layer_types / use_sliding_window); spiral_jax attends to every position, "
            f"which gives other logits past the window. Use a checkpoint with full attention in every layer")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency-dependent RoPE scaling (rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def float_dtype(name: str, value):
    """`value` as a floating-point dtype ("bfloat16", jnp.float32, ...), else a TypeError naming `name`:
    weights or activations cast to an integer or bool dtype would be garbage, silently."""
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if value is None or dtype is None or not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name}={value!r} is no floating-point dtype; use float32, bfloat16 or float16")
    return dtype


# ModelConfig fields a checkpoint's weights do not depend on: its token ids and the runtime choices.
_NOT_ARCHITECTURE = ("bos_token_id", "eos_token_id", "compute_dtype", "scan_layers", "remat", "remat_saves",
                     "attention", "decode_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture plus runtime choices. Frozen and hashable, so it can be a static jit argument."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    # None = the family's default: Qwen2 has q/k/v bias, Qwen3 has q/k RMSNorm, Llama neither.
    qkv_bias: bool | None = None  # bias on q/k/v
    o_bias: bool | None = None  # attention_bias=True on Llama/Qwen3 also puts a bias on o_proj
    qk_norm: bool | None = None  # RMSNorm over head_dim on q and k before RoPE
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    # Runtime choices (not part of the checkpoint).
    compute_dtype: str = "float32"  # bf16 on TPU/GPU; fp32 is faster on CPU
    scan_layers: bool = False  # stacked layers + lax.scan (TPU compile time) vs a per-layer list
    remat: bool = True  # rematerialise each layer in the backward pass
    # With remat: the REMAT_SAVES a layer keeps from its forward rather than computes again. "mlp" keeps
    # 2 x intermediate_size values a token and layer and spares two thirds of the recomputed products
    # (Qwen3).
    remat_saves: tuple[str, ...] = ()
    attention: str = "auto"  # self-attention kernel: auto, xla, splash (TPU), cudnn (GPU); see fused_attention
    # A decode step's attention: auto (Pallas on TPU where `attention` is, else XLA), pallas (TPU's or the
    # GPU's kernel where the heads allow), xla; see decode_attention.kernel.
    decode_attention: str = "auto"
    # LoRA (models/lora.py): rank 0 = off; else low-rank adapters on the `lora_targets` projections,
    # scaled by lora_alpha / lora_rank, and the weights beside them frozen.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"unsupported model_type {self.model_type!r}; spiral_jax supports "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (Qwen2/2.5, Qwen3, Llama 3.x)")
        family = dict(qkv_bias=self.model_type == "qwen2", o_bias=False, qk_norm=self.model_type == "qwen3")
        for name, default in family.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        object.__setattr__(self, "compute_dtype", float_dtype("compute_dtype", self.compute_dtype).name)
        if self.attention not in ("auto", "xla", "splash", "cudnn"):
            raise ValueError(f"attention={self.attention!r}; use auto (splash on TPU, cudnn on GPU, xla on "
                             f"CPU), xla, splash or cudnn")
        if self.decode_attention not in ("auto", "pallas", "xla"):
            raise ValueError(f"decode_attention={self.decode_attention!r}; use auto (Pallas on TPU, XLA "
                             f"elsewhere), pallas (the Pallas kernels on TPU and NVIDIA GPUs) or xla")
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        object.__setattr__(self, "remat_saves", tuple(self.remat_saves))
        if set(self.remat_saves) - set(REMAT_SAVES):
            raise ValueError(f"remat_saves={self.remat_saves}: each must be one of {', '.join(REMAT_SAVES)} "
                             f"(what a rematerialised layer keeps from its forward), or none")
        if self.lora_rank < 0 or (self.lora_rank and not self.lora_targets) or (
                set(self.lora_targets) - set(LORA_TARGETS)):
            raise ValueError(f"LoRA: rank={self.lora_rank}, targets={self.lora_targets}; the rank must be >= 0 "
                             f"(0 = off) and the targets a non-empty subset of {', '.join(LORA_TARGETS)}")
        if self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
            raise CheckpointError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}")

    @property
    def num_params(self) -> int:
        d, f, h, kv, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                           self.num_kv_heads, self.head_dim)
        per_layer = 2 * d + d * hd * (2 * h + 2 * kv) + 3 * d * f
        per_layer += (h + 2 * kv) * hd * self.qkv_bias + d * self.o_bias + 2 * hd * self.qk_norm
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + head + d + self.num_layers * per_layer

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @property
    def remat_summary(self) -> str:
        """"remat on", "remat off", or "remat on keeping mlp" and the like, for reports."""
        kept = f" keeping {' and '.join(self.remat_saves)}" if self.remat and self.remat_saves else ""
        return f"remat {'on' if self.remat else 'off'}{kept}"

    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def architecture_differences(self, other: "ModelConfig") -> list[str]:
        """The fields in which `other` is another architecture than this model, whose programs its weights
        would not run in; token ids and the runtime choices (dtype, remat, kernels) are no part of it."""
        return [f.name for f in dataclasses.fields(self) if f.name not in _NOT_ARCHITECTURE
                and getattr(self, f.name) != getattr(other, f.name)]

    def base(self) -> "ModelConfig":
        """This model without adapters: what merged weights, the sampler and HF checkpoints hold. Its
        LoRA settings are back at their defaults, so that it equals the config read from such a
        checkpoint (the adapters' alpha and targets are no part of the architecture)."""
        if not self.lora_rank:
            return self
        return self.replace(**{f.name: f.default for f in dataclasses.fields(self) if f.name.startswith("lora_")})

    # ---------------------------------------------------------------- HF config.json in and out

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], **runtime) -> "ModelConfig":
        model_type = hf.get("model_type")
        if model_type is None:
            raise CheckpointError("config.json has no 'model_type'; is this a transformers checkpoint?")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"unsupported model_type {model_type!r} in config.json; spiral_jax supports "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} (Qwen2/2.5, Qwen3, Llama 3.x)")
        quantized = hf.get("quantization_config")
        if quantized:
            method = quantized.get("quant_method", "some method") if isinstance(quantized, dict) else quantized
            raise CheckpointError(
                f"config.json has a quantization_config ({method}): spiral_jax trains and samples full-precision "
                f"weights and cannot read quantized ones; use the model's bf16 checkpoint (e.g. Qwen3-4B, "
                f"not Qwen3-4B-FP8 or an AWQ/GPTQ one)")
        architectures = hf.get("architectures")
        if isinstance(architectures, list) and architectures and not any(
                str(a).endswith("ForCausalLM") for a in architectures):
            raise CheckpointError(
                f"config.json has architectures={architectures}, not a causal language model (*ForCausalLM): its "
                f"weights have no LM head (a reward or classifier model?); use the model's base or instruct checkpoint")
        text = hf.get("text_config")  # some multimodal-style configs nest the decoder
        if isinstance(text, dict) and "hidden_size" not in hf:
            hf = {**hf, **text}
        hf = {"max_position_embeddings": _MAX_POSITIONS[model_type], **hf}
        if _flag(hf, "mlp_bias"):
            raise CheckpointError("config.json has mlp_bias=true; spiral_jax's MLP has no biases (no Qwen or "
                                  "Llama 3 checkpoint has them)")
        number = functools.partial(_number, hf)
        d, heads = number("hidden_size"), number("num_attention_heads")
        fields = dict(
            model_type=model_type,
            vocab_size=number("vocab_size"),
            hidden_size=d,
            intermediate_size=number("intermediate_size"),
            num_layers=number("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=number("num_key_value_heads", heads),
            head_dim=number("head_dim", d // heads),
        )
        _check_full_attention(hf, fields["num_layers"], number("max_position_embeddings"))
        act = hf.get("hidden_act", hf.get("hidden_activation", "silu"))
        if act not in ("silu", "swish"):
            raise CheckpointError(f"config.json has hidden_act={act!r}; spiral_jax's MLP is SwiGLU (silu)")
        for key in ("rope_parameters", "rope_scaling"):  # transformers 5.x, 4.x
            if not isinstance(hf.get(key) or {}, dict):
                raise CheckpointError(f"config.json has {key}={hf[key]!r}; it must be an object of RoPE settings "
                                      f"(rope_type, rope_theta, ...) or null")
        rope = {**(hf.get("rope_scaling") or {}), **(hf.get("rope_parameters") or {})}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None
        if rope_type == "llama3":
            scaling = RopeScaling(
                factor=_number(rope, "factor", kind=float, where="rope_scaling"),
                low_freq_factor=_number(rope, "low_freq_factor", kind=float, where="rope_scaling"),
                high_freq_factor=_number(rope, "high_freq_factor", kind=float, where="rope_scaling"),
                original_max_position_embeddings=_number(rope, "original_max_position_embeddings",
                                                         where="rope_scaling"))
        elif rope_type not in ("default", None):
            raise CheckpointError(
                f"unsupported rope type {rope_type!r}; spiral_jax supports default RoPE and 'llama3'")
        attention_bias = _flag(hf, "attention_bias")
        fields.update(
            rms_norm_eps=number("rms_norm_eps", 1e-6, kind=float, zero=True),
            # transformers 5 reads rope_parameters' theta before a top-level one
            rope_theta=_number({**hf, **rope}, "rope_theta", 10000.0, kind=float),
            rope_scaling=scaling,
            max_position_embeddings=number("max_position_embeddings"),
            tie_word_embeddings=_flag(hf, "tie_word_embeddings"),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            qk_norm=model_type == "qwen3",
            bos_token_id=token_ids(hf, "bos_token_id", many=False),
            eos_token_id=token_ids(hf, "eos_token_id"),
        )
        return cls(**fields, **runtime)

    @classmethod
    def from_pretrained(cls, path: str | Path, **runtime) -> "ModelConfig":
        path = Path(path)
        if path.is_file():  # a file of the checkpoint (config.json, model.safetensors) given for its folder
            raise CheckpointError(f"{path} is a file; give the checkpoint folder that holds config.json and the "
                                  f"weights ({path.parent})")
        if not path.exists():
            raise CheckpointError(f"checkpoint folder {path} does not exist")
        file = path / "config.json"
        if (path / "adapter_config.json").exists() and not file.exists():
            raise CheckpointError(f"{path} is a PEFT adapter folder (adapter_config.json), not a model; give a folder "
                                  f"of merged weights (`spiral-jax export` without --adapter writes one)")
        if ((path / "checkpoints").is_dir() or (path / "_CHECKPOINT_METADATA").exists()) and not (
                file.exists() and "model_type" in read_json_object(file)):
            raise CheckpointError(f"{path} is a spiral-jax run's out_dir or checkpoint, not a Hugging Face folder; "
                                  f"write it as one with `spiral-jax export --config CONFIG --out FOLDER` and give FOLDER")
        if not file.exists():
            raise CheckpointError(
                f"no config.json at {file}; pass a Hugging Face checkpoint folder (config.json + "
                f"*.safetensors), e.g. one written by save_pretrained")
        return cls.from_hf_dict(read_json_object(file), **runtime)

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json that transformers (4.x and 5.x) and vLLM load."""
        arch = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
        hf = {
            "architectures": [arch[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "torch_dtype": "float32",
        }
        if self.model_type != "qwen2":
            hf["attention_bias"] = self.o_bias
        if self.rope_scaling is not None:
            hf["rope_scaling"] = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        if self.bos_token_id is not None:
            hf["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            eos = self.eos_token_id
            hf["eos_token_id"] = list(eos) if isinstance(eos, tuple) else eos
        return hf
