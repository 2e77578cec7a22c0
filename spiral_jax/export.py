"""`spiral-jax export` once the weights are loaded: a Hugging Face folder (safetensors, config,
generation_config, tokenizer) or, for a LoRA run, a PEFT adapter folder, listed in the folder's
export manifest so that a later --overwrite removes exactly what this export wrote; before the weights
load, the folder is checked to be safe to write and to clear. Takes plain values, so the command line's
flags and config stay in cli.py."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

from spiral_jax.models import save_adapter, save_pretrained
from spiral_jax.paths import is_remote
from spiral_jax.run_dir import (LOCK_NAME, RUN_FILES, delete_listed, guarded_by, read_manifest, resolved,
                                 shared_folders, write_manifest)
from spiral_jax.tokenizer import read_generation_config


# A tokenizer folder's files, by the start of their names: the tokenizer and its config, the vocabulary
# and merges of BPE tokenizers, added tokens, and the chat template that newer transformers releases
# save beside the config (chat_template.jinja) rather than in it. Copied as they are, they load in
# whatever transformers release the model's own tokenizer loads in; saving them anew would write the
# installed release's format (transformers 5's does not load in 4.x).
TOKENIZER_FILES = ("tokenizer", "special_tokens", "vocab", "merges", "added_tokens", "chat_template")
EXPORT_MANIFEST_NAME = "export_manifest.json"


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


def check_export_dir(out: str, out_dir: str, overwrite: bool, reads: dict[str, str] | None = None) -> None:
    """Refuse an export folder that is not safe to write (and, with --overwrite, to clear): a URI
    (gs://...; export writes local files), the current folder or a parent of it, the home folder or a
    parent of it, the run's out_dir or a parent of it, a folder the export reads (`reads`: model.path
    and tokenizer.path, by config key) or a parent of it, a run file inside out_dir, a file, a
    non-empty folder without --overwrite, and a non-empty folder that no export wrote."""
    if not out:
        raise ValueError("--out is required (the folder to write the Hugging Face checkpoint to)")
    if is_remote(out):  # safetensors and transformers write local files; pathlib would make gs://b/x gs:/b/x here
        raise ValueError(f"--out {out}: export writes a local folder, not a URI; export to one, e.g. --out "
                         f"exported/NAME, then copy it there: gcloud storage rsync -r exported/NAME {out}")
    target = resolved(out)
    guarded = shared_folders()
    if not is_remote(out_dir):
        guarded["the run's out_dir"] = resolved(out_dir).resolve()
    for key, folder in (reads or {}).items():
        if folder and not is_remote(folder):  # an earlier export as the model: --overwrite would delete it
            guarded[f"{key}, a folder the export reads"] = resolved(folder).resolve()
    real = target.resolve()
    if taken := guarded_by(real, guarded):
        raise ValueError(f"--out {out} is {taken}; export into a new folder of its own, e.g. --out exported/NAME")
    run = guarded.get("the run's out_dir")
    if run is not None and run in real.parents and real.relative_to(run).parts[0] in (*RUN_FILES, LOCK_NAME):
        raise ValueError(f"--out {out} is inside the run's {real.relative_to(run).parts[0]}; export into a "
                         f"folder of its own, e.g. --out {run / 'hf'}")
    if target.exists() and not target.is_dir():
        raise ValueError(f"--out {out} is a file; export writes a folder (config, safetensors, tokenizer)")
    blocker = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise ValueError(f"cannot write to --out {out}: {blocker} is a file, not a folder; choose a folder "
                         f"you can write")
    if not target.is_dir() or not any(target.iterdir()):
        return
    if not overwrite:
        raise ValueError(f"--out {out} is not empty; pass an empty or new folder, or --overwrite to replace "
                         f"an earlier export there")
    if read_manifest(target, EXPORT_MANIFEST_NAME) is None:
        raise ValueError(f"--out {out} is not empty and holds no {EXPORT_MANIFEST_NAME}, so it is not an "
                         f"earlier export; --overwrite deletes only what an export listed, and nothing was "
                         f"deleted. Pass an empty or new folder")


def clear_export_dir(out: str) -> list[str]:
    """Delete what the earlier export in `out` listed (and its manifest); other files stay."""
    listed = read_manifest(out, EXPORT_MANIFEST_NAME)
    if listed is None:
        return []
    return delete_listed(out, [*listed, EXPORT_MANIFEST_NAME])


def record_export(out: str, before: set[str]) -> None:
    """List in `out`'s manifest what the export wrote: the entries that were not there `before`."""
    written = {p.name for p in Path(out).iterdir()} - set(before) - {EXPORT_MANIFEST_NAME}
    write_manifest(out, written, EXPORT_MANIFEST_NAME, written_by="spiral-jax export")
