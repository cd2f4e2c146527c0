"""Rotary Position Embedding on q and k (Su et al. 2021): pair (2t, 2t+1) of q_n, k_n turned by n·θ_t.

``scaling`` (PI, NTK-aware, YaRN, dynamic NTK) reaches the forward through three attributes that an
extrapolation row may swap: ``theta`` (float64 buffer, the frequencies), ``attention_scale`` (YaRN's sqrt(1/t) on
cos and sin, softmax attention only) and ``dynamic`` ((factor, L0) or None: a forward whose largest position + 1
is N > L0 turns at ``ntk_rescale(theta, factor·N/L0 - (factor - 1))``).  ``decay`` adds γ_h^(i-j): the kernel's
decay for linear attention, the score bias log γ_h·|i - j| for softmax, from a float64 buffer.
``rotary_fraction`` < 1 turns only the first r = int(d·fraction) dimensions' pairs (docs/schemes.md, "`rope`").
"""

from typing import Annotated, List, Mapping, Optional

import torch
from pydantic import Field

from linrope.base.options import OneOf
from linrope.ops.rope import (
    RAMPS,
    SCALINGS,
    YARN_BETA_FAST,
    YARN_BETA_SLOW,
    check_rope_dim,
    compute_dtype,
    dynamic_ntk_scale,
    ntk_rescale,
    partial_frequencies,
    rope_cos_sin,
    rope_frequencies,
    rotary_dims,
    rotate,
    yarn_mscale,
)

from .base import Base, PositionScheme, register
from .functional import DECAYS, decay_gamma_rate, distance_bias


@register
class RoPE(PositionScheme):
    name = "rope"
    kind = "relative"
    linear_ok = True
    linear_note = (
        "rotates φ(q), φ(k) in the numerator (or both, or neither: model.attention.placement); "
        "a decay as the per-head γ_h^(i-j); yarn's frequencies without its temperature, which the normalisation "
        "cancels"
    )
    paper = "Su et al. 2021, RoFormer: enhanced transformer with rotary position embedding"
    linear_placement = True
    even_head_dim = True
    evaluation_options = ("scaling", "factor", "original_context", "beta_fast", "beta_slow", "mscale", "ramp")
    # decay and rotary_fraction at their old behaviour: every checkpoint saved before they existed
    absent_as = {**PositionScheme.absent_as, "decay": None, "rotary_fraction": 1.0}
    variants = ({"decay": "retnet"}, {"scaling": "ntk", "factor": 2.0})

    def __init__(
        self,
        *,
        base: Base = 10000.0,
        scaling: Annotated[Optional[str], OneOf(lambda: SCALINGS)] = None,
        factor: Annotated[float, Field(gt=0)] = 1.0,
        original_context: Annotated[
            Optional[int], Field(ge=1, description="null: model.max_len, the training context")
        ] = None,
        beta_fast: Annotated[float, Field(gt=0)] = YARN_BETA_FAST,
        beta_slow: Annotated[float, Field(gt=0)] = YARN_BETA_SLOW,
        mscale: Annotated[Optional[float], Field(gt=0, description="null: 0.1·ln(factor) + 1")] = None,
        ramp: Annotated[str, OneOf(lambda: RAMPS)] = "release",
        decay: Annotated[Optional[str], OneOf(lambda: DECAYS), Field(description="null: no decay")] = None,
        rotary_fraction: Annotated[float, Field(gt=0, le=1, description="GPT-NeoX's rotary_pct")] = 1.0,
        **dims,
    ):
        super().__init__(**dims)
        check_rope_dim(self.head_dim)
        self.base, self.scaling, self.factor, self.decay = base, scaling, factor, decay
        self.rotary_fraction, self.rotary_dims = rotary_fraction, rotary_dims(self.head_dim, rotary_fraction)
        self.original_context = original_context or self.max_len
        self.yarn = dict(beta_fast=beta_fast, beta_slow=beta_slow, ramp=ramp)
        theta = rope_frequencies(
            self.rotary_dims, base, scaling=scaling, factor=factor, original_context=self.original_context, **self.yarn
        )
        # float64, never the model's dtype (``float64_buffer``): .bfloat16() must not round the frequencies
        self.float64_buffer("theta", partial_frequencies(theta, self.head_dim))
        self.mscale = mscale
        self.attention_scale = (yarn_mscale(factor) if mscale is None else mscale) if scaling == "yarn" else 1.0
        self.dynamic = (factor, self.original_context) if scaling == "dynamic" else None
        if decay is not None:  # γ_h and its rate -log γ_h, float64 (as ALiBi's slopes: rounded once, at each use)
            gamma, rate = decay_gamma_rate(decay, self.n_heads)
            self.float64_buffer("gamma", gamma)
            self.float64_buffer("rate", rate)

    @classmethod
    def dims_problems(cls, options: Mapping, *, head_dim: int, max_len: int, causal: bool) -> List[str]:
        try:
            rotary_dims(head_dim, options["rotary_fraction"])
        except ValueError as e:
            return [str(e)]
        return []

    @classmethod
    def linear_decays(cls, options: Mapping) -> bool:
        return options.get("decay") is not None

    @classmethod
    def shift_invariant(cls, options: Mapping) -> bool:
        return options.get("scaling") != "dynamic"  # dynamic NTK turns at the frequencies of the largest position

    @classmethod
    def name_parts(cls, options: Mapping) -> List[str]:
        """``retnet`` for a decay, then ``randomized``, then ``rot0.25`` for a partial rotary."""
        parts = [str(options["decay"])] if options.get("decay") else []
        parts += super().name_parts(options)
        fraction = options.get("rotary_fraction", 1.0)
        return parts + ([f"rot{fraction}"] if fraction != 1.0 else [])

    @classmethod
    def tags(cls, options: Mapping) -> List[str]:
        tags = [f"rope_scaling:{options['scaling']}"] if options.get("scaling") else []
        tags += [f"rope_decay:{options['decay']}"] if options.get("decay") else []
        tags += super().tags(options)
        fraction = options.get("rotary_fraction", 1.0)
        return tags + ([f"rotary_fraction:{fraction}"] if fraction != 1.0 else [])

    @classmethod
    def attention_problems(cls, attention_kind: str, options: Mapping) -> List[str]:
        if attention_kind == "linear" and options.get("mscale") is not None:
            return [
                f"model.position.mscale={options['mscale']}: YaRN's temperature scales softmax logits; "
                "linear attention normalises φ(q)·φ(k), which cancels it (leave mscale null)"
            ]
        return []

    @classmethod
    def option_problems(cls, options: Mapping) -> List[str]:
        """YaRN's options given to another scaling, or its ramp ends in the wrong order; a factor below 1 for the
        scalings that extend a context."""
        problems = super().option_problems(options)
        scaling = options.get("scaling")
        given = {k: options[k] for k, v in YARN_DEFAULTS.items() if options.get(k) != v}
        if scaling != "yarn" and given:
            said = ", ".join(f"{k}={v}" for k, v in given.items())
            problems.append(f"{said}: an option of scaling: yarn, and this model's scaling is {scaling or 'null'}")
        if scaling not in ("yarn", "dynamic") and options.get("original_context") is not None:
            problems.append(
                f"original_context={options['original_context']}: an option of scaling: yarn or dynamic, "
                f"and this model's scaling is {scaling or 'null'}"
            )
        if scaling == "dynamic" and options.get("max_position") is not None:
            problems.append(
                f"scaling: dynamic with max_position={options['max_position']} cannot work as defined: dynamic NTK "
                "turns at the forward's largest position, and randomized positions are drawn on the device, so only "
                "their bound is known; use another scaling or drop max_position"
            )
        if scaling in ("yarn", "dynamic") and options.get("factor", 1.0) < 1:
            problems.append(f"factor={options['factor']}: scaling: {scaling} extends the context, so factor >= 1")
        if scaling == "yarn" and not options.get("beta_fast") > options.get("beta_slow"):
            problems.append(
                f"beta_fast={options['beta_fast']}, beta_slow={options['beta_slow']}: YaRN's ramp needs "
                "beta_fast > beta_slow (the pairs turning beta_fast times within the original context are kept)"
            )
        return problems

    def frequencies(self, n: Optional[int]) -> torch.Tensor:
        """θ of a forward whose largest position + 1 is ``n`` (None: unknown, as trained): ``theta``, or with
        dynamic NTK and n > L0 its rescaling by factor·n/L0 - (factor - 1) (once per forward: ``memo``)."""
        if self.dynamic is None or n is None:
            return self.theta
        factor, context = self.dynamic
        scale = dynamic_ntk_scale(factor, n, context)
        if scale == 1:
            return self.theta
        turned = self.theta[: self.rotary_dims // 2]  # partial rotary: the other pairs stay at θ = 0
        return self.memo(("dynamic", n), lambda: partial_frequencies(ntk_rescale(turned, scale), self.head_dim))

    def rotate_qk(self, q, k, positions):
        dtype = compute_dtype(q.dtype)
        n = self.span(positions)[1] + 1 if self.dynamic is not None else None
        cos, sin = rope_cos_sin(positions, self.frequencies(n), dtype)
        if self.attention_scale != 1:  # YaRN's temperature, on cos and sin as released: q·k times its square
            cos, sin = cos * self.attention_scale, sin * self.attention_scale
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def score_bias(self, q, k, positions) -> Optional[torch.Tensor]:
        """With a decay, log γ_h·|i - j| (= -rate_h·|i - j|; causal attention masks j > i) in float64, rounded
        once to the scores' precision (``functional.distance_bias``, as ALiBi's); without, none."""
        if self.decay is None:
            return None
        return distance_bias(self.rate, positions, compute_dtype(q.dtype))

    def linear_rope_theta(self):
        """θ for linear attention's rotation (YaRN's temperature has no counterpart: the kernel's denominator, or the
        output's RMSNorm without one, cancels a common factor of φ(q)·φ(k)).  Dynamic NTK reads the forward's length
        from the positions the model placed (``offset … offset + N - 1``)."""
        if self.dynamic is None:
            return self.theta
        if self._span is None:
            raise ValueError(
                "rope scaling: dynamic with linear attention reads the forward's length from the model's offset; "
                "explicit positions are not supported"
            )
        return self.frequencies(self._span[1] + 1)

    def linear_decay(self):
        return self.gamma if self.decay is not None else None

    def extra_repr(self):
        decay = f", decay={self.decay}" if self.decay is not None else ""
        part = f", rotary_fraction={self.rotary_fraction}" if self.rotary_fraction != 1.0 else ""
        context = f", original_context={self.original_context}" if self.scaling in ("yarn", "dynamic") else ""
        yarn = "".join(f", {k}={v}" for k, v in self.yarn.items()) if self.scaling == "yarn" else ""
        temperature = f", attention_scale={self.attention_scale:.6g}" if self.scaling == "yarn" else ""
        return (
            f"where={self.where}, base={self.base}, scaling={self.scaling}, factor={self.factor}"
            f"{context}{yarn}{temperature}{decay}{part}"
        )


# YaRN's own options at their defaults (the release's): refused with another scaling when changed
YARN_DEFAULTS = {"beta_fast": YARN_BETA_FAST, "beta_slow": YARN_BETA_SLOW, "mscale": None, "ramp": "release"}
