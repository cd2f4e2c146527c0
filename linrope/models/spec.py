"""What a model is, said once: ``ModelConfig``.

Everything else that describes a model derives from it here: the check of its options (each component
declares and checks its own: the attention kind, ``linrope.models.attention``; the position scheme,
``linrope.positions``; the model's own fields, this dataclass) and of the pairing; its identity (what a checkpoint carries and a
resume compares); its wandb tags and run name; and its label (``model.name``) when ``attention=…`` /
``position=…`` replace a preset's pair.

The identity: softmax and linear attention, the two feature maps and the three RoPE placements share
every parameter name and shape, so a checkpoint of one loads into another without complaint.  A
checkpoint therefore carries ``identity()`` under ``IDENTITY_KEY`` (attention kind, feature map,
placement, position scheme and its options; linear attention's ``normalize`` only where it is false, so
that every earlier checkpoint keeps its identity), and resuming, testing or loading under another identity
is refused in one line that names what differs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any, Dict, List, Mapping, Optional, Tuple

from pydantic import Field

from linrope.base.errors import CheckpointMismatch, ConfigError, IncompatiblePairing, UnknownOption
from linrope.base.nested import differing, under
from linrope.base.options import Positive, declared, option_errors
from linrope.models.attention import ATTENTION
from linrope.positions import REGISTRY, PositionScheme, check_pairing, model_problems, scheme_class, scheme_settings
from linrope.positions import option_errors as position_errors

IDENTITY_KEY = "linrope_identity"  # top-level key of a checkpoint written by linrope.training.lit.LanguageModel


def scheme_or_base(name: Any):
    """The class of the scheme ``name``; for a name no scheme has (a config not yet checked), the base class, whose
    hooks say nothing of options it does not know."""
    return REGISTRY.get(name, PositionScheme) if isinstance(name, str) else PositionScheme


@dataclass
class ModelConfig:
    """The model's own options, each with its type and range (its attention and position scheme declare
    theirs: ``linrope.models.attention``, ``linrope.positions``)."""

    vocab_size: Positive = 256
    d_model: Positive = 256
    n_layers: Positive = 4
    n_heads: Positive = 4
    d_ff: Positive = 1024
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    max_len: Positive = 256  # positions a learned table holds; the training context by default
    causal: bool = True
    n_classes: Annotated[Optional[int], Field(ge=2)] = None  # set: an encoder with mean pooling and a classifier head
    tie_weights: bool = True
    # kernel of a depthwise convolution over time before each attention (causal for a decoder; Zoology's
    # BaseConv-style short mixing, which hands every position its neighbours' tokens); 0: none
    short_conv: Annotated[int, Field(ge=0)] = 0
    attention: Dict[str, Any] = field(default_factory=lambda: {"kind": "softmax"})
    position: Dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    name: Optional[str] = None  # the label (a preset's name; ``label``)
    task: str = "bytes"  # the data's task (set by linrope.training.builders.build_module)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "model") -> "ModelConfig":
        """The model of a plain mapping; a key it does not take is an ``UnknownOption`` naming the nearest."""
        known = [f.name for f in fields(cls)]
        for k in d:
            if k not in known:
                raise UnknownOption(f"{where}.{k}", known)  # before the dataclass's TypeError
        for k in ("attention", "position"):  # read as mappings by every check after this one
            if k in d and not isinstance(d[k], Mapping):
                raise ConfigError(f"{where}.{k}: expected a mapping of options; got {d[k]!r:.60}")
        return cls(**{k: dict(v) if isinstance(v, Mapping) else v for k, v in d.items()})

    @classmethod
    def checked(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """``from_dict``, then ``check``."""
        model = cls.from_dict(d)
        model.check()
        return model

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    # ---- the checks ---------------------------------------------------------------------------------------
    def problems(self) -> List[str]:
        """One line per problem no single value shows: an option a component does not take (or refuses), the
        pairing, divisibility, RoPE's even head dimension, a causal-only scheme (CoPE) in a bidirectional model,
        the scheme's options (checked by the scheme)."""
        return [str(e) for e in self._problems()]

    def check(self) -> None:
        """Raise ``ConfigError`` naming every problem (one per line); ``IncompatiblePairing`` for a pairing
        that cannot work."""
        found = self._problems()
        if len(found) == 1:
            raise found[0]
        if found:
            kind = IncompatiblePairing if any(isinstance(e, IncompatiblePairing) for e in found) else ConfigError
            raise kind("\n".join(str(e) for e in found))

    def _problems(self) -> List[ConfigError]:
        kind, pos = self.attention.get("kind"), self.position.get("name")
        if kind not in ATTENTION:
            return [ConfigError(f"model.attention.kind={kind}: expected one of {', '.join(sorted(ATTENTION))}")]
        parts = ("attention", "position")  # each checked by its component, below
        errors = option_errors(declared(ModelConfig, skip=parts), self.to_dict(), "model", also=parts)
        errors += ATTENTION[kind].option_errors(self.attention_options())
        errors += position_errors(pos, self.position_options())
        if errors:
            return [ConfigError(e) for e in errors]
        found: List[ConfigError] = []
        try:
            check_pairing(kind, pos, self.position_options())
        except IncompatiblePairing as e:
            found.append(e)
        d, h, scheme = int(self.d_model), int(self.n_heads), scheme_class(pos)
        dims = dict(head_dim=d // h, max_len=int(self.max_len), causal=bool(self.causal))
        if d % h:
            found.append(ConfigError(f"model.d_model={d} is not divisible by model.n_heads={h}"))
        elif scheme.even_head_dim and (d // h) % 2:
            found.append(
                ConfigError(f"position={pos} needs an even head dimension, but d_model/n_heads = {d}/{h} = {d // h}")
            )
        else:
            found += [ConfigError(e) for e in model_problems(pos, self.position_options(), **dims)]
        problem = scheme.causal_problem(bool(self.causal))
        if problem:
            found.append(ConfigError(problem))
        found += [ConfigError(e) for e in scheme.attention_problems(kind, self.position_options())]
        window = self.attention.get("window")
        if window is not None and not self.causal:
            found.append(ConfigError(f"model.attention.window={window} limits causal attention; model.causal is false"))
        return found

    # ---- the parts, as the layers take them ----------------------------------------------------------------
    def attention_options(self) -> Dict[str, Any]:
        return {k: v for k, v in self.attention.items() if k != "kind"}

    def position_options(self) -> Dict[str, Any]:
        return {k: v for k, v in self.position.items() if k != "name"}

    def position_dims(self) -> Dict[str, Any]:
        return dict(
            d_model=self.d_model, n_heads=self.n_heads, head_dim=self.head_dim, max_len=self.max_len, causal=self.causal
        )

    def attention_setting(self, option: str) -> Any:
        """An attention option as the layer uses it: given, or the kind's default."""
        cls = ATTENTION.get(self.attention.get("kind"))
        return self.attention.get(option, None if cls is None else cls.options().get(option))

    # ---- what a model is called ----------------------------------------------------------------------------
    def identity(self) -> Dict[str, Any]:
        """``{"attention.kind": ..., "attention.feature_map": ..., "attention.placement": ...,
        "position.name": ..., "position.<option>": ...}``: what a checkpoint must agree on to be this model."""
        kind = self.attention.get("kind")
        out: Dict[str, Any] = {"attention.kind": kind}
        if kind == "linear":
            out.update({f"attention.{k}": self.attention_setting(k) for k in ("feature_map", "placement")})
            if not self.normalized():  # only then: the identity of every earlier checkpoint is unchanged
                out["attention.normalize"] = False
        # what evaluation may change is no part of it (the scheme's ``evaluation_options``: RoPE's scaling), nor an
        # option left at its old behaviour (``absent_as``: RoPE's decay None, rotary_fraction 1, max_position None):
        # earlier checkpoints, which lack the key, agree
        scheme = scheme_or_base(self.position.get("name"))
        absent = scheme.absent_as
        out.update(
            {
                f"position.{k}": v
                for k, v in sorted(self.position.items())
                if k not in scheme.evaluation_options and not (k in absent and v == absent[k])
            }
        )
        if self.short_conv:
            out["short_conv"] = self.short_conv
        return out

    def tags(self, task: Optional[str] = None) -> List[str]:
        """wandb tags: attention kind, position scheme, task, feature map, RoPE placement, scaling and decay."""
        kind, pos = self.attention.get("kind"), self.position.get("name")
        scheme = scheme_or_base(pos)
        tags = [f"attention:{kind}", f"position:{pos}", f"task:{task or self.task}"]
        if kind == "linear":
            tags += [f"feature_map:{self.attention_setting('feature_map')}"]
            if scheme.linear_placement:
                tags += [f"placement:{self.attention_setting('placement')}"]
            if not self.normalized():
                tags += ["normalize:false"]
        return tags + scheme.tags(self.position_options())  # the scheme's options: RoPE's scaling, decay, …

    def position_table_bounded(self) -> bool:
        """Whether the scheme holds a table of ``max_len`` positions (``bounded_by_max_len``): no position beyond."""
        return scheme_class(self.position["name"]).bounded_by_max_len(
            scheme_settings(self.position["name"], self.position_options())
        )

    def normalized(self) -> bool:
        """Linear attention with its denominator (``model.attention.normalize``, true unless set false)."""
        return self.attention.get("kind") != "linear" or bool(self.attention_setting("normalize"))

    def run_name(self, seed: Any) -> str:
        """wandb's run name: ``linear-elu-rope-s1234`` (the placement when it is not the numerator:
        ``linear-elu-rope-both-s1234``; then what the scheme says of its options, ``PositionScheme.name_parts``:
        RoPE's decay, ``linear-elu-rope-retnet-s1234``, KERPLE's power kernel, ``softmax-kerple-power-s1234``,
        ``-randomized`` with randomized positions; ``-norm`` for linear attention without a denominator, its output
        normalised)."""
        kind, pos = self.attention.get("kind"), self.position.get("name")
        scheme = scheme_or_base(pos)
        name = kind
        if kind == "linear":
            name += f"-{self.attention_setting('feature_map')}"
        name += f"-{pos}"
        if kind == "linear" and scheme.linear_placement and self.attention_setting("placement") != "numerator":
            name += f"-{self.attention['placement']}"
        name += "".join(f"-{part}" for part in scheme.name_parts(self.position_options()))
        if not self.normalized():
            name += "-norm"
        return f"{name}-s{seed}"

    def label(
        self, chosen: Optional[Tuple[str, str]] = None, preset: Optional[Tuple[str, str]] = None
    ) -> Optional[str]:
        """``model.name`` of a model whose config options (conf/attention, conf/position) were ``chosen``
        where its preset chose ``preset``: the preset's name while they agree (or either is unknown), else
        the label of the chosen pairing (``pair_label``)."""
        if chosen is None or preset is None or tuple(chosen) == tuple(preset):
            return self.name
        return pair_label(*chosen) + ("" if self.normalized() else "_norm")


def pair_label(attention: str, position: str) -> str:
    """The label of an attention × position pairing, by their config options: ``<attention>_<position>``;
    linear attention without position information (a scheme of kind ``none``) is named by its attention alone
    (the presets ``linear``, ``linear_cosine``)."""
    silent = position in REGISTRY and REGISTRY[position].kind == "none"
    return attention if silent and attention != "softmax" else f"{attention}_{position}"


def model_identity(model: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The identity of a plain model config (``ModelConfig.identity``)."""
    return ModelConfig.from_dict(model or {}).identity()


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
    # another attention kind or position scheme: its options are another vocabulary, name the kind alone
    kinds = ("attention.kind", "position.name")
    replaced = [k.split(".")[0] + "." for k in kinds if found.get(k) != expected.get(k)]
    return "; ".join(
        f"model.{k}: {a} in the checkpoint, {b} now"
        for k, a, b in differing(found, expected, null_is_absent=True)
        if k in kinds or not under(k, replaced)
    )


def check_identity(
    checkpoint: Mapping[str, Any], model_cfg: Optional[Mapping], *, where: str = "the checkpoint"
) -> None:
    """Raise ``CheckpointMismatch`` when the checkpoint is another model (attention kind, feature map, RoPE
    placement, position scheme or its options), even where every parameter fits."""
    diff = identity_differences(checkpoint_identity(checkpoint), model_identity(model_cfg))
    if diff:
        raise CheckpointMismatch(f"{where} is a checkpoint of another model: {diff}")
