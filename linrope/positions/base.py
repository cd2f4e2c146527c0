"""The one small interface every position scheme implements.

A scheme is one module holding one ``PositionScheme`` subclass, registered by
name.  The model builds it in up to three roles:

* ``where="input"`` — once, at the embedding: ``embed(x, positions)`` (absolute schemes);
* ``where="shared"`` — once, for schemes whose paper shares parameters across layers
  (``shares`` says what): only those parameters;
* ``where="attention"`` — once per attention layer: the hooks on q/k, on the
  scores and on the values (relative schemes).  Given ``shared=`` (the model's one
  shared-role instance), a layer borrows those parameters instead of allocating its
  own; without it (``share: false``, or a layer built on its own) it owns them.

A scheme allocates parameters only for the role it is built for, so no layer
carries parameters it never uses.  Softmax attention calls, in order::

    q, k  = scheme.rotate_qk(q, k, positions)               # RoPE
    s     = scheme.score_scale(d) * q·k + scheme.score_bias(q, k, positions)
    o     = softmax(s) @ v + scheme.value_term(softmax(s), positions)

Linear attention never forms the score matrix; it asks only
``linear_rope_theta()`` (RoPE frequencies) and ``linear_decay()`` (per-head γ, the
decay form of ALiBi).

**Options and traits.**  A scheme's options are its constructor's keyword arguments, each annotated with
its type and range (``k: Positive = 16``; ``linrope.base.options``): that signature is the one declaration
the config check, a saved config and ``build_position`` read.  What depends on several options,
``option_problems``.  What the rest of the code asks of a scheme it reads from its traits, never from its
name: ``linear_ok`` (linear attention may take it; ``check_pairing`` refuses the rest), ``tables`` (its
position tables, not weight-decayed), ``score_biases`` (its additive score biases, not weight-decayed),
``bounded_by_max_len`` (a table of ``max_len`` positions: no longer sequence), ``shares``, ``linear_decays`` (with
these options linear attention takes a per-head decay γ_h^(i-j)), ``causal_only`` (why it cannot serve
bidirectional attention; ``causal_problem`` says so in one line, at the config check and at build).  What a run is
called and what identifies its checkpoint, ``linrope.models.spec`` asks the scheme too: ``name_parts`` and ``tags``
(what its options add to the run's name and tags), ``linear_placement``, ``even_head_dim``, ``attention_problems``,
``evaluation_options`` and ``absent_as``.  What the contract suite (tests/positions/test_contract.py) checks of
every scheme it reads from the same traits and from two claims: ``shift_invariant`` (only differences of positions
enter) and ``variants`` (option sets under which the positions enter in another way, checked beside the defaults).
Every trait is a class attribute; the three asked with the options read one (``shift_invariant``:
``differences_only``, ``bounded_by_max_len``: ``max_len_table``, ``linear_decays``: ``decays``), and only a scheme
whose options decide the answer overrides the method (RoPE, multiplicative).  A new scheme is one module in this
folder (``register``), found without a list (``linrope.positions``): see CONTRIBUTING.md.

**Where the positions come from.**  Every scheme takes ``max_position`` (``linrope.positions.randomized``:
randomized positions, Ruoss et al. 2023): null, the forward's positions are ``offset … offset+N-1``; set, they
are an ordered random subset of ``0 … max_position-1``, drawn once per forward by the input role
(``place``) and handed by the model to every layer.
"""

from __future__ import annotations

import math
from typing import Annotated, Callable, ClassVar, Dict, List, Mapping, Optional, Tuple, Type

import torch
from pydantic import Field
from torch import nn

from linrope.base.errors import ConfigError
from linrope.base.options import Positive  # noqa: F401 - the schemes' modules import it from here

from .functional import position_span
from .randomized import MaxPosition, place_positions

# the types of options several schemes take (their ranges, written once)
Base = Annotated[float, Field(gt=0)]  # the wavelength base of sinusoids and RoPE
InitStd = Annotated[float, Field(ge=0)]  # the std of a parameter's initial values
# what the model passes every scheme itself: not options of model.position
DIMS = ("where", "d_model", "n_heads", "head_dim", "max_len", "causal", "shared")

ROLES = ("input", "attention", "shared")


class PositionScheme(nn.Module):
    name: ClassVar[str] = "?"
    kind: ClassVar[str] = "none"  # "none" | "absolute" | "relative" | "contextual" (positions from q and k)
    linear_ok: ClassVar[bool] = False  # may linear attention take this scheme?
    linear_note: ClassVar[str] = ""  # why not / how (shown in errors and README)
    has_value_term: ClassVar[bool] = False  # needs the attention probabilities (no SDPA fast path)
    paper: ClassVar[str] = ""
    shares: ClassVar[str] = ""  # what the paper shares across layers ("": nothing, and no `share` option)
    # parameters added to scores (or to every query) as biases: not weight-decayed, like every bias
    # (T5's β, TUPE's b, XL's u and v): docs/methods.md#weight-decay
    score_biases: ClassVar[Tuple[str, ...]] = ()
    # its position tables (rows indexed by position or distance): not weight-decayed, like the token embedding
    tables: ClassVar[Tuple[str, ...]] = ()
    causal_only: ClassVar[str] = ""  # why it cannot serve bidirectional attention ("": it can)

    @classmethod
    def causal_problem(cls, causal: bool) -> Optional[str]:
        """One line if the scheme cannot serve attention that is (not) ``causal`` (a scheme defined only for keys at
        or behind the query, refused for ``model.causal=false``), else None."""
        if causal or not cls.causal_only:
            return None
        return f"model.causal=false with position={cls.name} cannot work: {cls.causal_only}"

    # its attention hooks read positions themselves, not only i - j (TUPE's absolute correlation): with packed
    # documents they are given each document's positions, (B, N), and must take them; every other scheme gets
    # the row's positions 0 … N-1 and the documents' mask (docs/mathematics.md, "Packed documents")
    absolute_terms: ClassVar[bool] = False
    # linear attention's ``placement`` (numerator, both, none) says where it acts: named in the run's name and tags
    linear_placement: ClassVar[bool] = False
    even_head_dim: ClassVar[bool] = False  # rotates pairs of a head's dimensions: refused at the config check if odd
    # options that evaluation may change without changing the trained model (RoPE's context scaling): no part of
    # the model's identity (``linrope.models.spec``)
    evaluation_options: ClassVar[Tuple[str, ...]] = ()
    # options that are no part of the identity at these values, which every checkpoint saved before the option
    # existed had (so that it keeps its identity)
    absent_as: ClassVar[Mapping[str, object]] = {"max_position": None}
    # option sets under which the positions enter in another way (another kernel, variant, table, decay, bucket
    # range): the contract suite (tests/positions/test_contract.py) checks each beside the defaults
    variants: ClassVar[Tuple[Mapping[str, object], ...]] = ()
    # constant answers of the traits that take the options (a scheme whose options decide overrides the method):
    differences_only: ClassVar[bool] = False  # ``shift_invariant``: only differences of positions enter
    max_len_table: ClassVar[bool] = False  # ``bounded_by_max_len``: a table of ``max_len`` positions
    decays: ClassVar[bool] = False  # ``linear_decays``: linear attention takes it as a per-head decay γ_h^(i-j)

    @classmethod
    def shift_invariant(cls, options: Mapping) -> bool:
        """Whether, with ``options`` (every option, defaults filled in), only differences of positions enter, so that a
        shift of every position (a window's offset) leaves the output unchanged; the contract suite checks the
        claim.  ``differences_only``, unless the scheme's options decide (RoPE's dynamic NTK)."""
        return cls.differences_only

    @classmethod
    def name_parts(cls, options: Mapping) -> List[str]:
        """What the run's name says of the scheme's ``options`` (as the config gives them), after
        ``<attention>-<scheme>``: ``randomized`` with randomized positions; a scheme adds its own around it."""
        return ["randomized"] if options.get("max_position") else []

    @classmethod
    def tags(cls, options: Mapping) -> List[str]:
        """The run's wandb tags of the scheme's ``options`` (as the config gives them), after ``position:<name>``."""
        return [f"randomized:{options['max_position']}"] if options.get("max_position") else []

    @classmethod
    def attention_problems(cls, attention_kind: str, options: Mapping) -> List[str]:
        """One line per option (as the config gives them) that the attention ``attention_kind`` cannot honour
        although it takes the scheme (YaRN's temperature under linear attention)."""
        return []

    @classmethod
    def bounded_by_max_len(cls, options: Mapping) -> bool:
        """Whether, with ``options`` (every option, defaults filled in), it holds a table of ``max_len``
        positions, so that it cannot score a longer sequence.  ``max_len_table``, unless the scheme's options decide
        (multiplicative's ``table``)."""
        return cls.max_len_table

    @classmethod
    def linear_decays(cls, options: Mapping) -> bool:
        """Whether, with ``options`` (every option, defaults filled in), linear attention takes it as a per-head
        decay γ_h^(i-j) on its kernel weights (ALiBi, RoPE with ``decay``): a decay that counts tokens, not
        positions (``linrope.positions.randomized``).  ``decays``, unless the scheme's options decide (RoPE's
        ``decay``)."""
        return cls.decays

    @classmethod
    def option_problems(cls, options: Mapping) -> List[str]:
        """One line per problem of ``options`` (every option, defaults filled in) that no single option's type
        and range shows."""
        if not cls.shares and options.get("share") is not None:
            return [f"{cls.name} has no parameters to share across layers; drop its 'share' option"]
        return []

    @classmethod
    def dims_problems(cls, options: Mapping, *, head_dim: int, max_len: int, causal: bool) -> List[str]:
        """One line per problem of ``options`` (every option, defaults filled in) with the model's dimensions
        (T5's buckets in a bidirectional model, a partial rotary's pairs of the head dimension): asked at the config
        check (``model_problems``) and by ``build_position``, before the scheme is built."""
        return []

    def __init__(self, *, where: str, d_model: int, n_heads: int, head_dim: int, max_len: int,
                 causal: bool = True, share: Optional[bool] = None, max_position: MaxPosition = None,
                 shared: Optional["PositionScheme"] = None):  # fmt: skip
        super().__init__()
        problem = self.causal_problem(causal)
        if problem:
            raise ConfigError(problem)
        if where not in ROLES:
            raise ValueError(f"position scheme role must be one of {ROLES}, got {where!r}")
        self.where, self.d_model, self.n_heads, self.head_dim = where, d_model, n_heads, head_dim
        self.max_len, self.causal = max_len, causal
        self.share = bool(self.shares) if share is None else bool(share)  # default: as the paper
        self.max_position = max_position  # randomized positions (linrope.positions.randomized); None: 0 … N-1
        if shared is not None and (where != "attention" or type(shared) is not type(self) or shared.where != "shared"):
            raise ValueError(f"{self.name}: only an attention layer borrows, and only from a shared-role {self.name}")
        self.__dict__["_borrowed"] = shared  # not a submodule: its parameters belong to the model, counted once
        self._memo: Optional[dict] = None
        self._span: Optional[Tuple[int, int]] = None
        self._float64: List[str] = []  # ``float64_buffer``

    def float64_buffer(self, name: str, value: torch.Tensor) -> None:
        """A float64 buffer, not saved (a function of the options), that follows the module's device but never its
        dtype: ``.float()``, ``.half()``, ``.bfloat16()`` leave it alone, and each use rounds what it forms once, to
        the precision of the scores (ALiBi's slopes: a float32 copy would be 4e-7 off at 12 heads)."""
        self.register_buffer(name, value, persistent=False)
        self._float64.append(name)

    def _apply(self, fn, recurse=True):
        kept = {name: getattr(self, name) for name in self._float64}
        super()._apply(fn, recurse)
        for name, t in kept.items():  # follow the device, stay float64
            setattr(self, name, t.to(getattr(self, name).device))
        return self

    # ---- parameters shared across layers -------------------------------------------------------
    def owns_shared(self) -> bool:
        """Allocate the cross-layer parameters here: the shared role, or a layer with none to borrow."""
        return self.where == "shared" or (self.where == "attention" and self._borrowed is None)

    @property
    def src(self) -> "PositionScheme":
        """Where the cross-layer parameters live: the borrowed shared-role instance, or this one."""
        return self._borrowed if self._borrowed is not None else self

    def open_memo(self, span: Optional[Tuple[int, int]] = None) -> None:
        """From here to ``close_memo`` (one forward of the model): terms that depend on the positions only are
        computed by the first layer that asks and reused by the others (``memo``), and ``span``, the first and
        last of the forward's positions as the model knows them on the host (Python ints), is what ``span()``
        answers.  Two calls in a try/finally rather than a context manager, which torch.compile of torch 2.4
        cannot trace."""
        self._memo = {}
        self._span = span

    def close_memo(self) -> None:
        self._memo = None
        self._span = None

    def memo(self, key, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if self._memo is None:
            return make()
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def shared_bias(self, positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The score bias of a scheme whose bias depends on the positions alone (T5, TUPE, FIRE, KERPLE, Sandwich):
        its ``position_bias(positions, dtype)``, formed by the instance that holds the cross-layer parameters
        (``src``) once per forward and reused by every layer that shares them (``memo``)."""
        src = self.src
        return src.memo(("position_bias", id(positions), dtype), lambda: src.position_bias(positions, dtype))

    def span(self, positions: torch.Tensor) -> Tuple[int, int]:
        """(smallest, largest) of ``positions``, Python ints: what sizes a table slice or an ODE grid and checks
        a table's range without reading the device (docs/mathematics.md#gpu-readiness).  Inside a model's forward the
        model says (its positions are ``offset … offset + N - 1``); positions handed in as a tensor are read
        once (``position_span``: a host sync, outside training)."""
        if self._span is not None:
            return self._span
        return self.memo(("span", id(positions)), lambda: position_span(positions))

    def place(self, n: int, offset: int = 0, device=None, *, continuing: bool = False):
        """The positions of one forward of ``n`` tokens and their span (Python ints, ``open_memo``): the model asks
        its input-role scheme once and hands the answer to every scheme.  ``offset … offset+n-1``, or with
        ``max_position`` an ordered random subset of ``0 … max_position-1`` (``randomized.place_positions``)."""
        if self.max_position is None:
            return torch.arange(offset, offset + n, device=device), (offset, offset + n - 1)
        return place_positions(n, self.max_position, device, offset=offset, continuing=continuing)

    # ---- hook at the input (where == "input") -------------------------------------------------
    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, N, D) token embeddings; positions: (N,) integer positions, or (B, N) with packed documents
        (each counted from its document's start)."""
        return x

    def block_input(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (B, N, D) the input of every block after the first (schemes that re-inject, FLOATER); positions as
        ``embed`` has them."""
        return x

    # ---- hooks inside softmax attention (where == "attention") ---------------------------------
    def rotate_qk(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def score_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    def score_bias(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
        """Additive term on the scores, broadcastable to (B, H, N, N), already scaled; None for none."""
        return None

    def value_term(self, probs: torch.Tensor, positions: torch.Tensor) -> Optional[torch.Tensor]:
        """Extra output Σ_j a_ij · value_term_ij, (B, H, N, d); only when ``has_value_term``."""
        return None

    # ---- what linear attention may use ----------------------------------------------------------
    def linear_rope_theta(self) -> Optional[torch.Tensor]:
        return None

    def linear_decay(self) -> Optional[torch.Tensor]:
        return None

    def extra_repr(self) -> str:
        return f"where={self.where}" + (f", share={self.share}" if self.shares else "")


REGISTRY: Dict[str, Type[PositionScheme]] = {}


def register(cls: Type[PositionScheme]) -> Type[PositionScheme]:
    if cls.name in REGISTRY:
        raise ValueError(f"position scheme {cls.name!r} registered twice")
    REGISTRY[cls.name] = cls
    return cls
