"""What makes a model *this* model, beyond its parameter names and shapes.

Softmax and linear attention, the two feature maps and the three RoPE placements share every
parameter name and shape, so a checkpoint of one loads into another without complaint.  A checkpoint
therefore carries the model's identity (``IDENTITY_KEY``: attention kind, feature map, placement,
position scheme and its options), and resuming, testing or loading under another identity is refused
in one line that names what differs.  Light: no torch, no Lightning (linrope.config uses it)."""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

IDENTITY_KEY = "linrope_identity"  # top-level key of a checkpoint written by linrope.lit.LanguageModel
# position options that evaluation may change without changing the trained model (RoPE context scaling)
EVALUATION_OPTIONS = ("scaling", "factor")
LINEAR_DEFAULTS = {"feature_map": "elu", "placement": "numerator"}  # as linrope.attention.LinearAttention


def model_identity(model: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """``{"attention.kind": ..., "attention.feature_map": ..., "attention.placement": ...,
    "position.name": ..., "position.<option>": ...}`` of a model config (a plain mapping)."""
    model = model or {}
    att, pos = dict(model.get("attention") or {}), dict(model.get("position") or {})
    out: Dict[str, Any] = {"attention.kind": att.get("kind")}
    if att.get("kind") == "linear":
        out.update({f"attention.{k}": att.get(k, d) for k, d in LINEAR_DEFAULTS.items()})
    out.update({f"position.{k}": v for k, v in sorted(pos.items()) if k not in EVALUATION_OPTIONS})
    return out


def checkpoint_identity(checkpoint: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The identity a checkpoint was saved with; for checkpoints older than ``IDENTITY_KEY``, the one
    of its saved model config (``hyper_parameters.model``); None when it has neither."""
    stored = checkpoint.get(IDENTITY_KEY)
    if isinstance(stored, Mapping):
        return dict(stored)
    model = (checkpoint.get("hyper_parameters") or {}).get("model")
    return model_identity(model) if isinstance(model, Mapping) else None


def identity_differences(found: Optional[Mapping[str, Any]], expected: Optional[Mapping[str, Any]]) -> str:
    """``model.attention.kind: softmax in the checkpoint, linear now; …`` ('' when they agree or one is
    unknown)."""
    if not found or not expected:
        return ""
    keys = sorted(set(found) | set(expected))
    # another attention kind or position scheme: its options are another vocabulary, name the kind alone
    changed = {k.split(".")[0] for k in ("attention.kind", "position.name") if found.get(k) != expected.get(k)}
    keys = [k for k in keys if k.split(".")[0] not in changed or k in ("attention.kind", "position.name")]
    return "; ".join(f"model.{k}: {found.get(k, '(absent)')} in the checkpoint, {expected.get(k, '(absent)')} now"
                     for k in keys if found.get(k) != expected.get(k))
