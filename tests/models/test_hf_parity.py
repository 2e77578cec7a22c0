"""fp32 logits equal transformers' on tiny random models of every family, with left padding."""
import numpy as np
import pytest
import torch

from spiral_jax.models import forward, load_pretrained

TOL = 1e-4


def _padded_batch(vocab, lengths, total, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.zeros((len(lengths), total), np.int32)
    mask = np.zeros((len(lengths), total), np.int32)
    for row, n in enumerate(lengths):
        ids[row, total - n:] = rng.integers(0, vocab, n)
        mask[row, total - n:] = 1
    return ids, mask


def _torch_logits(model, ids, mask):
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    position_ids=torch.tensor(positions, dtype=torch.long))
    return out.logits.float().numpy()


@pytest.mark.parametrize("scan_layers", [False, True])
def test_logits_match_transformers(hf_model, scan_layers, layouts):
    family, path, model = hf_model
    cfg, params = load_pretrained(path, scan_layers=scan_layers)
    ids, mask = _padded_batch(cfg.vocab_size, [320, 257, 290], 320)
    ours = np.asarray(forward(params, cfg, ids, mask))
    ref = _torch_logits(model, ids, mask)
    valid = mask.astype(bool)
    diff = np.abs(ours - ref)[valid].max()
    print(f"{family} scan={scan_layers} {layouts} layouts: max |logit diff| = {diff:.2e} over {valid.sum()} tokens")
    assert np.abs(ref).max() > 1.0  # logits of order 1, so 1e-4 is a meaningful bound
    assert diff < TOL


def test_llama3_rope_scaling_changes_logits(tmp_path):
    """The tiny Llama's original_max_position_embeddings is small enough for the scaling to bite."""
    from tests.tiny_models import make_hf_model

    scaled = make_hf_model("llama", tmp_path / "scaled")
    plain = make_hf_model("llama", tmp_path / "plain", rope_scaling=None)
    ids, mask = _padded_batch(512, [256], 256)
    cfg, params = load_pretrained(tmp_path / "scaled")
    ours = np.asarray(forward(params, cfg, ids, mask))
    assert np.abs(ours - _torch_logits(scaled, ids, mask)).max() < TOL
    assert np.abs(ours - _torch_logits(plain, ids, mask)).max() > 1e-2


def test_bf16_logits_are_as_close_to_fp32_as_transformers_bf16(hf_model):
    """compute_dtype=bfloat16 against transformers in bf16. The two round in different places (fused
    products, accumulation order), so their logits need not agree bit for bit; what must hold is that
    ours are no further from the fp32 logits than transformers' own bf16 logits are, within a margin
    of 1.5x and one bf16 rounding step at the logits' scale (2^-8 relative to their largest value)."""
    import copy

    family, path, model = hf_model
    ids, mask = _padded_batch(model.config.vocab_size, [96, 64], 96, seed=1)
    valid = mask.astype(bool)
    reference = _torch_logits(model, ids, mask)[valid]
    theirs = _torch_logits(copy.deepcopy(model).to(torch.bfloat16), ids, mask)[valid]
    cfg, params = load_pretrained(path, compute_dtype="bfloat16")
    ours = np.asarray(forward(params, cfg, ids, mask), np.float32)[valid]
    their_error, our_error = np.abs(theirs - reference).max(), np.abs(ours - reference).max()
    print(f"{family} bf16: max |logit - fp32| ours {our_error:.3g}, transformers {their_error:.3g}")
    assert their_error > 0  # bf16 really ran on both sides
    assert our_error <= 1.5 * their_error + 2**-8 * np.abs(reference).max()
