"""`spiral-jax export` once the weights are loaded: a Hugging Face folder (safetensors, config,
generation_config, tokenizer) or, for a LoRA run, a PEFT adapter folder, listed in the folder's
export manifest so that a later --overwrite removes exactly what this export wrote. Takes plain
values, so the command line's flags and config stay in cli.py."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

from spiral_jax.models import save_adapter, save_pretrained
from spiral_jax.run_dir import check_export_dir, clear_export_dir, record_export
from spiral_jax.tokenizer import read_generation_config


# A tokenizer folder's files, by the start of their names: the tokenizer and its config, the vocabulary
# and merges of BPE tokenizers, added tokens, and the chat template that newer transformers releases
# save beside the config (chat_template.jinja) rather than in it. Copied as they are, they load in
# whatever transformers release the model's own tokenizer loads in; saving them anew would write the
# installed release's format (transformers 5's does not load in 4.x).
TOKENIZER_FILES = ("tokenizer", "special_tokens", "vocab", "merges", "added_tokens", "chat_template")


def check_export_args(spec, out: str, overwrite: bool, adapter: bool, max_shard_gib: float, given=()) -> None:
    """Before any weights are loaded: a folder that is unsafe to write (`check_export_dir`), a shard size
    that is no size, --adapter on a run without LoRA adapters or on one whose frozen weights no folder
    holds (a random init), and --adapter with the flags of merged weights in `given` (those on the
    command line), which it would ignore."""
    check_export_dir(out, spec.out_dir, overwrite,
                     reads={"model.path": spec.model_path, "tokenizer.path": spec.tokenizer_path})
    if not 0 < max_shard_gib < math.inf:
        raise ValueError(f"--max_shard_gib={max_shard_gib:g}: give the largest safetensors file in GiB, a number "
                         f"above 0 (default 5)")
    if adapter and not spec.model.lora_rank:
        raise ValueError("--adapter writes a LoRA run's adapters, and this run trains none (model.lora.rank=0); "
                         "leave out --adapter to export the weights")
    if adapter and (flags := [f"--{n}" for n in given if n in ("dtype", "max_shard_gib")]):
        raise ValueError(f"{' and '.join(flags)} {'are' if len(flags) > 1 else 'is'} for merged weights; --adapter "
                         f"writes the adapters as trained (float32, one file): leave out {' and '.join(flags)}")
    if adapter and not spec.model_path:
        raise ValueError("--adapter writes adapters that load on top of the weights at model.path, and this run's "
                         "frozen weights are a random init (model.path is empty) that no folder holds; leave out "
                         "--adapter to export the weights with the adapters merged in")


def export_checkpoint(cfg, params, tokenizer, out: str | Path, *, model_path: str = "", tokenizer_path: str = "",
                      dtype: str = "float32", max_shard_bytes: int = 5 * 2**30, adapter: bool = False) -> int:
    """Write `params` to `out`: merged weights in `dtype`, split above `max_shard_bytes`, with the
    tokenizer's own files (from the folder `tokenizer_path`, else `model_path`) copied as they are, or
    the tokenizer saved by transformers when there is no such folder; with `adapter`, the LoRA adapters
    alone, on top of `model_path`. Exit status 0."""
    out = Path(out)
    clear_export_dir(out)  # --overwrite: nothing the old export wrote survives next to the new
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    # The manifest comes first (a small file, while the disk has room) and is rewritten if the export
    # fails part-way, so that --overwrite can clear what a failed export left behind.
    out.mkdir(parents=True, exist_ok=True)
    record_export(out, before)
    try:
        return _write(cfg, params, tokenizer, out, model_path, tokenizer_path, dtype, max_shard_bytes, adapter, before)
    except BaseException:
        try:
            record_export(out, before)
        except OSError:
            pass  # a full disk: the manifest written first still lets --overwrite clear what it can
        raise


def _write(cfg, params, tokenizer, out: Path, model_path, tokenizer_path, dtype, max_shard_bytes, adapter,
           before) -> int:
    if adapter:
        save_adapter(cfg, params, out, base_model=model_path)
        record_export(out, before)
        print(f"wrote a PEFT LoRA adapter (rank {cfg.lora_rank}, alpha {cfg.lora_alpha:g}, on "
              f"{', '.join(cfg.lora_targets)}) to {out}; base model: {model_path}")
        return 0
    # The checkpoint's own generation defaults (vLLM samples with them unless a request says otherwise),
    # with the run's stop ids: a turn under the run's template ends at them.
    generation = read_generation_config(model_path) if model_path else {}
    generation.update(eos_token_id=sorted(tokenizer.stop_ids), bos_token_id=tokenizer.hf.bos_token_id)
    save_pretrained(cfg, params, out, dtype=dtype, max_shard_bytes=max_shard_bytes, generation_config=generation)
    source = tokenizer_path or model_path
    if source and Path(source).is_dir():  # the tokenizer's own files, as they are
        for f in Path(source).iterdir():
            if f.is_file() and (f.name.startswith(TOKENIZER_FILES) or f.suffix == ".model"):
                shutil.copy(f, out / f.name)
    else:
        tokenizer.hf.save_pretrained(out)
    record_export(out, before)
    for written in out.iterdir():
        if written.name not in before:
            written.chmod(0o644)
    print(f"wrote a Hugging Face checkpoint ({dtype} safetensors, config, generation_config, tokenizer) "
          f"to {out}")
    return 0
