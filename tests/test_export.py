"""`export_checkpoint`'s tokenizer files: the model's own, copied byte for byte."""
import json
import shutil

from transformers import AutoTokenizer, GenerationConfig

from spiral_jax.config import EMBEDDED_TOKENIZER
from spiral_jax.export import export_checkpoint


def test_the_tokenizers_own_files_are_copied_as_they_are_chat_template_included(tmp_path, tiny_model):
    """A chat template saved beside the config (chat_template.jinja, as newer transformers releases
    write it) travels with the export, and the config keeps its own format: saving the tokenizer anew
    would write the installed transformers' names, which older releases cannot read."""
    cfg, params, tokenizer = tiny_model
    source = tmp_path / "model"
    shutil.copytree(EMBEDDED_TOKENIZER, source)
    (source / "notes.txt").write_text("not a tokenizer file")
    out = tmp_path / "exported"
    assert export_checkpoint(cfg, params, tokenizer, out, model_path=str(source)) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    assert not (out / "notes.txt").exists()
    exported, own = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(source)
    assert exported.chat_template == own.chat_template is not None
    messages = [{"role": "user", "content": "Free cells: [4]"}]
    assert exported.apply_chat_template(messages, add_generation_prompt=True) == \
        own.apply_chat_template(messages, add_generation_prompt=True)


def test_the_checkpoints_generation_defaults_travel_with_the_runs_stop_ids(tmp_path, tiny_model):
    """vLLM samples with generation_config.json's defaults where a request sets none: the export keeps
    the checkpoint's own (temperature, top-p, top-k) and stops where the run's turns end."""
    cfg, params, tokenizer = tiny_model
    source = tmp_path / "model"
    shutil.copytree(EMBEDDED_TOKENIZER, source)
    own = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 3}
    (source / "generation_config.json").write_text(json.dumps(own))
    out = tmp_path / "exported"
    assert export_checkpoint(cfg, params, tokenizer, out, model_path=str(source)) == 0
    written = GenerationConfig.from_pretrained(out)
    assert (written.do_sample, written.temperature, written.top_p, written.top_k) == (True, 0.6, 0.95, 20)
    assert written.eos_token_id == sorted(tokenizer.stop_ids) and 3 not in tokenizer.stop_ids
    assert (source / "generation_config.json").read_text() == json.dumps(own)  # the source is left as it was
