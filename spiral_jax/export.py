"""`spiral-jax export` once the weights are loaded: a Hugging Face folder (safetensors, config,
generation_config, tokenizer) or, for a LoRA run, a PEFT adapter folder, listed in the folder's
export manifest so that a later --overwrite removes exactly what this export wrote. Takes plain
values, so the command line's flags and config stay in cli.py."""
from __future__ import annotations

import shutil
from pathlib import Path

from spiral_jax.models import save_adapter, save_pretrained
from spiral_jax.run_dir import clear_export_dir, record_export


def export_checkpoint(cfg, params, tokenizer, out: str | Path, *, model_path: str = "", tokenizer_path: str = "",
                      dtype: str = "float32", max_shard_bytes: int = 5 * 2**30, adapter: bool = False) -> int:
    """Write `params` to `out`: merged weights in `dtype`, split above `max_shard_bytes`, with the model's
    own tokenizer files (from `tokenizer_path`, else `model_path`) copied as they are, or the tokenizer
    saved by transformers when there are none; with `adapter`, the LoRA adapters alone, on top of
    `model_path`. Exit status 0."""
    out = Path(out)
    clear_export_dir(out)  # --overwrite: nothing the old export wrote survives next to the new
    before = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if adapter:
        save_adapter(cfg, params, out, base_model=model_path)
        record_export(out, before)
        print(f"wrote a PEFT LoRA adapter (rank {cfg.lora_rank}, alpha {cfg.lora_alpha:g}, on "
              f"{', '.join(cfg.lora_targets)}) to {out}; base model: {model_path or 'the random init'}")
        return 0
    save_pretrained(cfg, params, out, dtype=dtype, max_shard_bytes=max_shard_bytes,
                    generation_config={"eos_token_id": sorted(tokenizer.stop_ids),
                                       "bos_token_id": tokenizer.hf.bos_token_id})
    source = Path(tokenizer_path or model_path) if tokenizer_path != "embedded" else None
    if source is not None and source.is_dir():  # the model's own tokenizer files, as they are
        for f in source.iterdir():
            if f.is_file() and (f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges"))
                                or f.suffix == ".model"):
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
