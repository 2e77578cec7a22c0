"""Whether a checkpoint's parameters fit the run's config, decided before any array is read:
`LayoutError`, with the setting to change, for a checkpoint written in an older weight layout, with
its layers stacked the other way, or by a config that shaped the parameter tree otherwise."""
from __future__ import annotations

import re

import jax

from spiral_jax.models.params import PARAM_LAYOUT


class LayoutError(ValueError):
    """A checkpoint whose weights this run cannot take as they are: written by a version that stored
    them in another layout, or by a config that shaped the parameter tree another way."""


# What orbax says when the tree a run asks for is unlike the one saved (a config that differs from the
# one that wrote the checkpoint), as opposed to a file it cannot read.
TREE_MISMATCHES = ("tree structures do not match", "Structure mismatch", "Type mismatch at key path",
                   "is not compatible with the stored shape")


def saved_layers_stacked(mismatch: str) -> bool | None:
    """From orbax's tree-mismatch error: whether the checkpoint holds the layers stacked (a dict of
    arrays with a layer axis) or one by one (a list), where that is what differs from this run's
    tree; None where it is not. Newer orbax releases call this run's side Source and the checkpoint's
    Target, older ones lhs and rhs; a partial restore names this run's side the template."""
    sides = re.search(r"\blayers:\s+- Source: <class '(list|dict)'>\s+- Target: <class '(list|dict)'>"
                      r"|'layers': Diff\(lhs=<class '(list|dict)'>, rhs=<class '(list|dict)'>\)"
                      r"|'layers'\): template has type <class '(list|dict)'>, but structure has type "
                      r"<class '(list|dict)'>", mismatch)
    return None if sides is None else (sides[2] or sides[4] or sides[6]) == "dict"


def param_shapes(tree) -> dict[str, list[int]] | None:
    """{key path: shape} of a train state's (or a {"params": ...} dict's) parameters; None without any."""
    params = tree.get("params") if isinstance(tree, dict) else getattr(tree, "params", None)
    if params is None:
        return None
    return {jax.tree_util.keystr(path): list(x.shape) for path, x in jax.tree_util.tree_leaves_with_path(params)}


def check_layout(directory, step: int, meta: dict, like) -> None:
    """Before any array is read: the checkpoint's weight layout, and its parameters' names and
    shapes (in `meta` where the version that wrote it saved them) against those of `like` (a
    train state, or {"params": ...})."""
    if meta.get("param_layout") != PARAM_LAYOUT:
        raise LayoutError(
            f"checkpoint step {step} in {directory} stores weights in an older layout ([in, out]; "
            f"this version stores them [out, in] like Hugging Face). It cannot be resumed by this "
            f"version: resume it with the spiral_jax version that wrote it, or start a new out_dir")
    saved, wanted = meta.get("param_shapes"), param_shapes(like)
    if saved is None or wanted is None:
        return
    stacked = [any(k.startswith("['layers']['") for k in shapes) for shapes in (saved, wanted)]
    if stacked[0] != stacked[1]:
        raise layers_unlike(directory, step, stacked[0])
    missing = [k for k in wanted if k not in saved]
    extra = [k for k in saved if k not in wanted]
    other = [k for k in wanted if k in saved and saved[k] != wanted[k]]
    if missing or extra or other:
        parts = []
        if missing:
            parts.append(f"lacks {len(missing)} parameter(s) this run's config makes (first {missing[0]})")
        if extra:
            parts.append(f"holds {len(extra)} it does not make (first {extra[0]})")
        if other:
            parts.append(f"holds {other[0]} as {tuple(saved[other[0]])} where the config makes "
                         f"{tuple(wanted[other[0]])}")
        raise unlike(directory, step, "; ".join(parts))


def layers_unlike(directory, step: int, saved_stacked: bool) -> LayoutError:
    return LayoutError(
        f"checkpoint step {step} in {directory} holds the layers "
        f"{'stacked' if saved_stacked else 'one by one'} (model.scan_layers={saved_stacked}), this run's "
        f"config the other way: resume it with --config.model.scan_layers={saved_stacked}")


def unlike(directory, step: int, what: str) -> LayoutError:
    return LayoutError(
        f"checkpoint step {step} in {directory} {what}: it was written with another model, "
        f"model.lora or model.scan_layers setting. Resume, evaluate or export it with the config that "
        f"wrote it (out_dir/config.json), or start a new out_dir")
