"""The contract every position scheme keeps, written once and read from the registry (CONTRIBUTING.md): each check
takes a scheme's name and options and asserts what the scheme's traits claim, so that a new scheme is checked by
being registered, with no list of names to extend.  tests/positions/test_contract.py runs every check over every
registered scheme (its defaults and each of its ``variants``); tests/positions/test_new_scheme.py runs them on a
throwaway scheme registered for that test, as CONTRIBUTING.md's worked example adds one.

What the checks read of a scheme:

- ``linear_ok``, ``linear_note``: linear attention takes it, or refuses it in one line that says why (also at
  randomized positions, and when the model is built); ``linear_decays``: linear attention's decay acts;
- ``shift_invariant``: only differences of positions enter, so a shifted window gives the same output (at the layer,
  causal and bidirectional, and in a model); the distances matter, unless the scheme has no positions (``kind``
  none) or counts its own (contextual); an ``absolute`` scheme sees the shift;
- ``has_value_term``: the explicit path only then (SDPA otherwise); ``bounded_by_max_len``: a table of ``max_len``
  rows refuses a longer window in one line (and a scheme without one takes it); ``causal_only``: a bidirectional
  model refused in one line, at the config check and at build; ``even_head_dim``: an odd head dimension
  refused in one line at the config check, and built by every other scheme;
- ``shares``: the ``share`` option only then; what is shared is counted once, used by every layer, the same as tied
  per-layer copies, and its position-only terms computed once per forward (when no parameter stays per layer);
- every scheme: a model with it trains (forward and backward, finite gradients that reach its parameters), takes
  three AdamW steps at context 256 in float32 and bf16, and traces in one graph under torch.compile.

The layers and models here are small and float64 where numbers are compared (the formula tests in the scheme's own
file, tests/positions/test_<scheme>.py, are the place for a scheme's numbers)."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from linrope.base.errors import ConfigError, IncompatiblePairing, SequenceTooLong
from linrope.models.attention import SoftmaxAttention
from linrope.models.model import TransformerLM
from linrope.models.spec import ModelConfig
from linrope.positions import REGISTRY, PositionScheme, build_position, check_pairing
from linrope.positions import scheme_settings as settings
from tests import helpers
from tests.helpers import case_id as scheme_case_id
from tests.helpers import scheme_cases

D, H, HD = 16, 2, 8  # d_model, heads, head dim of the attention-level checks
SHIFT_TOL = 1e-12  # a shifted window, float64: the same output to this (relative and absolute)
CAUSAL = [True, False]


# ---------------------------------------------------------------------------------------------------
# what the checks run over
# ---------------------------------------------------------------------------------------------------
def cases(registry=None) -> list:
    """``(name, options)`` of every scheme of ``registry`` (the registry): its defaults, then each of its ``variants``."""
    if registry is None:
        return scheme_cases()
    return [(name, dict(o)) for name, cls in sorted(registry.items()) for o in ({}, *cls.variants)]


def case_id(case) -> str:
    return scheme_case_id(case[0], case[1])


def with_causal(found: list) -> list:
    """Each case causal and bidirectional (a causal-only scheme: causal only), as pytest params."""
    return [
        pytest.param(name, opts, causal, id=f"{case_id((name, opts))}-{'causal' if causal else 'bidirectional'}")
        for name, opts in found
        for causal in CAUSAL
        if causal or not REGISTRY[name].causal_only
    ]


def params(found: list) -> list:
    return [pytest.param(name, opts, id=case_id((name, opts))) for name, opts in found]


def claims(found: list, claim) -> list:
    """The cases whose scheme (class, every option) makes ``claim(cls, settings)``."""
    return [(n, o) for n, o in found if claim(REGISTRY[n], settings(n, o))]


# ---------------------------------------------------------------------------------------------------
# small layers and models
# ---------------------------------------------------------------------------------------------------
def attention(name, *, causal=True, max_len=128, n_heads=H, randomize=True, **opts) -> SoftmaxAttention:
    """A float64 SoftmaxAttention layer of width D with scheme ``name``; its position parameters drawn large (std
    0.5, unless ``randomize`` is False) so that every position term visibly moves the output."""
    pos = build_position(
        name, where="attention", d_model=D, n_heads=n_heads, head_dim=D // n_heads, max_len=max_len, causal=causal,
        **opts,
    )  # fmt: skip
    att = SoftmaxAttention(D, n_heads, pos, causal=causal).double()
    if randomize:
        with torch.no_grad():
            for p in pos.parameters():
                p.normal_(0.0, 0.5)
    return att


def random_positions(n, high=60):
    """n sorted, distinct, non-contiguous positions in [0, high)."""
    return torch.randperm(high)[:n].sort().values


def tiny_lm(name, *, causal=True, attention_kind="softmax", n_layers=2, **opts) -> TransformerLM:
    """tests.helpers' tiny model with scheme ``name`` (options ``opts``); linear attention in the naive form."""
    naive = {"impl": "naive"} if attention_kind == "linear" else {}
    return helpers.tiny_lm({"name": name, **opts}, attention_kind, n_layers=n_layers, causal=causal, **naive)


def lm_step(m, causal):
    """One forward and backward: a finite loss, finite gradients on every parameter, and the position parameters
    learn (grads reach them through SDPA's mask, too)."""
    x = torch.randint(0, 32, (2, 12))
    logits = m(x, offset=2)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, 32), x[:, 1:].reshape(-1)) if causal else logits.pow(2).mean()
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    pos_params = [p for n, p in m.named_parameters() if ".pos." in f".{n}" or n.startswith("pos_shared.")]
    if pos_params:
        assert sum(p.grad.abs().sum() for p in pos_params) > 0


# ---------------------------------------------------------------------------------------------------
# pairings: linear attention takes the scheme, or refuses it in one line
# ---------------------------------------------------------------------------------------------------
def check_linear_pairing(name, opts, max_position=None):
    """Softmax attention takes every scheme; linear attention takes it where ``linear_ok``, else refuses it in one line
    naming the pairing and the reason (``linear_note``), at randomized positions (``max_position``) too."""
    cls = REGISTRY[name]
    given = {**opts, "max_position": max_position} if max_position else (opts or None)
    check_pairing("softmax", name, given)
    if cls.linear_ok and max_position and cls.linear_decays(settings(name, given)):  # a decay counts tokens
        with pytest.raises(IncompatiblePairing, match="counts tokens, not positions"):
            check_pairing("linear", name, given)
        return
    if cls.linear_ok:
        check_pairing("linear", name, given)
        return
    assert cls.linear_note, f"{name}: a scheme linear attention refuses says why (linear_note)"
    with pytest.raises(IncompatiblePairing) as e:
        check_pairing("linear", name, given)
    msg = str(e.value)
    assert "\n" not in msg
    assert f"attention=linear with position={name} cannot work: {name} is a" in msg  # names the pairing
    assert "N×N score matrix" in msg and cls.linear_note in msg  # and the reason


def check_linear_pairing_at_randomized_positions(name, opts):
    check_linear_pairing(name, opts, max_position=64)


def check_linear_refused_at_build(name, opts):
    """The model is never built: the same refusal, with and without randomized positions."""
    for given in (opts, {**opts, "max_position": 64}):
        with pytest.raises(IncompatiblePairing, match=f"attention=linear with position={name} cannot work"):
            tiny_lm(name, attention_kind="linear", **given)


def check_linear_lm_trains(name, opts, causal):
    m = tiny_lm(name, causal=causal, attention_kind="linear", **opts)
    lm_step(m, causal)
    if REGISTRY[name].linear_decays(settings(name, opts)):  # the decay acts: not linear attention without position
        ref = tiny_lm("none", causal=causal, attention_kind="linear")
        ref.load_state_dict(m.state_dict())
        x = torch.randint(0, 32, (2, 12))
        assert (m(x) - ref(x)).abs().max() > 1e-6


def check_causal_only(name, opts):
    """A causal-only scheme in a bidirectional model: one line at the config check (before any data is read) and at
    build; every other scheme takes it."""
    cls = REGISTRY[name]
    cfg = dict(vocab_size=32, d_model=32, n_layers=1, n_heads=4, d_ff=64, causal=False, position={"name": name, **opts})
    problems = ModelConfig.from_dict(cfg).problems()
    assert ModelConfig.from_dict({**cfg, "causal": True}).problems() == []
    if not cls.causal_only:
        assert problems == []
        return
    line = f"model.causal=false with position={name} cannot work: {cls.causal_only}"
    assert problems == [line]
    with pytest.raises(ConfigError, match=f"model.causal=false with position={name} cannot work"):
        TransformerLM(cfg)
    with pytest.raises(ConfigError, match=f"model.causal=false with position={name} cannot work"):
        build_position(name, where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=8, causal=False, **opts)


def check_head_dim_parity(name, opts):
    """``even_head_dim``: a scheme that needs an even head dimension says so, and an odd one is refused in one line at
    the config check; every other scheme builds a model with one (head dimension 3)."""
    cls = REGISTRY[name]
    cfg = dict(vocab_size=32, d_model=24, n_layers=1, n_heads=8, d_ff=64, position={"name": name, **opts})
    problems = ModelConfig.from_dict(cfg).problems()
    if cls.even_head_dim:
        assert problems == [f"position={name} needs an even head dimension, but d_model/n_heads = 24/8 = 3"]
        return
    assert problems == []
    TransformerLM(cfg)  # a scheme that needs an even head dimension without saying so is refused here


# ---------------------------------------------------------------------------------------------------
# positions: a shift, the distances, the attention path, a table's length
# ---------------------------------------------------------------------------------------------------
def check_shift_invariance(name, opts, causal):
    """Claimed by ``shift_invariant``: the layer at shifted positions gives the same output; the distances matter
    (kind ``none`` has none, a contextual scheme counts its own)."""
    att = attention(name, causal=causal, **opts)
    x = torch.randn(2, 12, D, dtype=torch.float64)
    positions = random_positions(12)
    shift = int(torch.randint(1, 60, ()))
    out = att(x, positions)[0]
    torch.testing.assert_close(att(x, positions + shift)[0], out, rtol=SHIFT_TOL, atol=SHIFT_TOL)
    if REGISTRY[name].kind not in ("none", "contextual"):  # other distances, other output
        near = torch.arange(12)
        assert not torch.allclose(att(x, near * 2)[0], att(x, near)[0], atol=1e-6)


def check_model_ignores_offset(name, opts, causal):
    """Claimed by ``shift_invariant``: a model at another offset gives the same output."""
    m = tiny_lm(name, causal=causal, **opts).double()
    ids = torch.randint(0, 32, (2, 10))
    torch.testing.assert_close(m(ids, offset=23), m(ids), rtol=SHIFT_TOL, atol=SHIFT_TOL)


def check_absolute_sees_offset(name, opts):
    m = tiny_lm(name, **opts).double()
    x = torch.randint(0, 32, (2, 10))
    assert (m(x, offset=17) - m(x)).abs().max() > 1e-3


def check_attention_path(name, opts):
    """SDPA unless the scheme has a value term (it needs the probabilities: the explicit path)."""
    att = attention(name, **opts)
    taken = []
    explicit = att._explicit
    att._explicit = lambda *a, **k: taken.append(1) or explicit(*a, **k)
    att(torch.randn(1, 6, D, dtype=torch.float64), torch.arange(6))
    assert bool(taken) == att.pos.has_value_term, (name, opts, att.pos.has_value_term)


def check_table_length(name, opts):
    """``bounded_by_max_len``: max_len positions run, a longer window (or one offset past the table) is one line
    naming the table and max_len; a scheme without such a table takes the longer window."""
    m = TransformerLM(
        dict(vocab_size=32, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=8, position={"name": name, **opts})
    )
    m(torch.randint(0, 32, (1, 8)))  # exactly max_len: fine
    longer = (lambda: m(torch.randint(0, 32, (1, 9))), lambda: m(torch.randint(0, 32, (1, 4)), offset=5))
    if not REGISTRY[name].bounded_by_max_len(settings(name, opts)):
        for call in longer:
            assert torch.isfinite(call()).all()
        return
    for call in longer:
        with pytest.raises(SequenceTooLong) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg and "8 rows" in msg and "max_len" in msg and name in msg


def check_softmax_lm_trains(name, opts, causal):
    if not causal and REGISTRY[name].causal_only:  # defined for causal attention only: refused at the config check
        with pytest.raises(ConfigError, match=f"model.causal=false with position={name} cannot work"):
            tiny_lm(name, causal=causal, **opts)
        return
    lm_step(tiny_lm(name, causal=causal, **opts), causal)


# ---------------------------------------------------------------------------------------------------
# parameters shared across layers
# ---------------------------------------------------------------------------------------------------
def check_share_option(name, opts):
    """``share`` is an option only where the paper shares something."""
    if REGISTRY[name].shares:
        tiny_lm(name, n_layers=1, **{**opts, "share": True})
        tiny_lm(name, n_layers=1, **{**opts, "share": False})
        return
    with pytest.raises(ValueError, match=f"{name} has no parameters to share across layers"):
        tiny_lm(name, n_layers=1, **opts, share=True)


def size(module) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def check_shared_counted_once(name, opts):
    """With sharing, a model grows with depth as without positions, plus what stays per layer; without, every layer
    carries its own copy of what the paper shares."""
    on, off = {**opts, "share": True}, {**opts, "share": False}
    step_none = tiny_lm("none", n_layers=3).num_params() - tiny_lm("none", n_layers=2).num_params()  # one block
    one = tiny_lm(name, n_layers=1, **on)
    assert one.pos_shared is not None and tiny_lm(name, n_layers=1, **off).pos_shared is None
    per_layer, shared = size(one.blocks[0].attn.pos), size(one.pos_shared)
    # something to share, or no parameters
    assert shared > 0 or size(tiny_lm(name, n_layers=1, **off).blocks[0].attn.pos) == 0
    step = tiny_lm(name, n_layers=3, **on).num_params() - tiny_lm(name, n_layers=2, **on).num_params()
    assert step == step_none + per_layer
    step_own = tiny_lm(name, n_layers=3, **off).num_params() - tiny_lm(name, n_layers=2, **off).num_params()
    assert step_own == step + shared


def check_every_layer_uses_the_shared_module(name, opts):
    m = tiny_lm(name, n_layers=3, **opts, share=True)
    assert all(b.attn.pos.src is m.pos_shared for b in m.blocks)
    shared = dict(m.pos_shared.named_parameters())
    keys = list(m.state_dict())
    assert not any(".attn.pos." in k and k.split(".attn.pos.")[1] in shared for k in keys)  # saved once, pos_shared
    m(torch.randint(0, 32, (2, 10))).pow(2).mean().backward()
    for n, p in shared.items():  # every layer's gradient lands on the one copy
        assert p.grad is not None and p.grad.abs().sum() > 0, n


def check_sharing_is_tied_copies(name, opts):
    """The shared model is the per-layer model with every layer's copy set to the same values."""
    torch.manual_seed(0)
    shared = tiny_lm(name, n_layers=2, **opts, share=True).double()
    own = tiny_lm(name, n_layers=2, **opts, share=False).double()
    state = own.state_dict()
    for key, value in shared.state_dict().items():
        if key.startswith("pos_shared."):
            for i in range(2):
                state[f"blocks.{i}.attn.pos.{key[len('pos_shared.') :]}"] = value
        else:
            state[key] = value
    own.load_state_dict(state)
    x = torch.randint(0, 32, (2, 12))
    torch.testing.assert_close(own(x), shared(x), rtol=1e-10, atol=1e-10)
    if size(own.blocks[1].attn.pos):
        with torch.no_grad():  # untie: layer 1 gets other values, and the models part
            for p in own.blocks[1].attn.pos.parameters():
                p.add_(torch.randn_like(p))
        assert not torch.allclose(own(x), shared(x), atol=1e-6)


def memo_misses(model, x) -> int:
    """How many position-only terms (``PositionScheme.memo``) one forward of ``model`` computed, every scheme of
    every role together (a span read is no term)."""
    made = []
    schemes = [mod for mod in model.modules() if isinstance(mod, PositionScheme)]
    for s in schemes:

        def counting(key, make, original=s.memo):
            return original(key, lambda: made.append(key) or make())

        s.memo = counting  # the instance's attribute, over the method
    try:
        model(x)
    finally:
        for s in schemes:
            del s.memo
    return sum(1 for key in made if not (isinstance(key, tuple) and key[:1] == ("span",)))


def check_position_terms_once_per_forward(name, opts):
    """With nothing left per layer, the shared part computes its position-only terms once per forward for every
    layer (and afresh in the next forward); each layer of the per-layer model computes its own."""
    x = torch.randint(0, 32, (2, 9))
    shared, own = tiny_lm(name, n_layers=4, **opts, share=True), tiny_lm(name, n_layers=4, **opts, share=False)
    once = memo_misses(shared, x)
    assert once == (0 if size(shared.blocks[0].attn.pos) else 1), once
    assert memo_misses(shared, x) == once  # a fresh forward computes it afresh
    assert memo_misses(own, x) == 4 * once


# ---------------------------------------------------------------------------------------------------
# training steps, bf16 and torch.compile, on a model config
# ---------------------------------------------------------------------------------------------------
CONTEXT = 256  # beyond one chunk of linear attention


def check_three_steps(cfg: dict, bf16: bool):
    """The model takes 3 AdamW steps on one batch of ``CONTEXT`` tokens in plain torch, in float32 or under CPU
    bf16 autocast: finite gradients and losses throughout, and in float32 the loss falls."""
    torch.manual_seed(0)
    model = TransformerLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 256, (1, CONTEXT + 1), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses), losses
    if not bf16:  # the same batch three times: float32 must learn it
        assert losses[-1] < losses[0], losses


# ---------------------------------------------------------------------------------------------------
# which check runs on which case: the one statement, read by test_contract.py and test_new_scheme.py
# ---------------------------------------------------------------------------------------------------
def _shares(cls, s, opts):
    return bool(cls.shares) and "share" not in opts  # a variant that sets share is checked at its own value


# check: (the function, whether a case is checked: claim(cls, settings, options), how ``causal`` is given: None for
# no argument, "both" causal and bidirectional (a causal-only scheme: causal only), "every" both for every scheme)
CONTRACT = {
    "linear_pairing": (check_linear_pairing, lambda cls, s, o: True, None),
    "linear_pairing_at_randomized_positions": (check_linear_pairing_at_randomized_positions, lambda *a: True, None),
    "linear_refused_at_build": (check_linear_refused_at_build, lambda cls, s, o: not cls.linear_ok, None),
    "linear_lm_trains": (check_linear_lm_trains, lambda cls, s, o: cls.linear_ok, "both"),
    "causal_only": (check_causal_only, lambda cls, s, o: True, None),
    "head_dim_parity": (check_head_dim_parity, lambda cls, s, o: True, None),
    "shift_invariance": (check_shift_invariance, lambda cls, s, o: cls.shift_invariant(s), "both"),
    "model_ignores_offset": (check_model_ignores_offset, lambda cls, s, o: cls.shift_invariant(s), "both"),
    "absolute_sees_offset": (check_absolute_sees_offset, lambda cls, s, o: cls.kind == "absolute", None),
    "attention_path": (check_attention_path, lambda cls, s, o: True, None),
    "table_length": (check_table_length, lambda cls, s, o: True, None),
    "softmax_lm_trains": (check_softmax_lm_trains, lambda cls, s, o: True, "every"),
    "share_option": (check_share_option, lambda cls, s, o: True, None),
    "shared_counted_once": (check_shared_counted_once, _shares, None),
    "every_layer_uses_the_shared_module": (check_every_layer_uses_the_shared_module, _shares, None),
    "sharing_is_tied_copies": (check_sharing_is_tied_copies, _shares, None),
    "position_terms_once_per_forward": (check_position_terms_once_per_forward, _shares, None),
}


def selected(check: str, found=None) -> list:
    """The pytest params (name, options[, causal]) the check ``check`` runs on among ``found`` (every case)."""
    _, claim, causal = CONTRACT[check]
    found = cases() if found is None else found
    chosen = [(n, o) for n, o in found if claim(REGISTRY[n], settings(n, o), o)]
    if causal is None:
        return params(chosen)
    if causal == "both":
        return with_causal(chosen)
    return [
        pytest.param(n, o, x, id=f"{case_id((n, o))}-{'causal' if x else 'bidirectional'}")
        for n, o in chosen
        for x in CAUSAL
    ]


def run_contract(found: list) -> list:
    """Every check on every case of ``found`` it runs on (the suite's tests, one after the other): the names of the
    checks run."""
    ran = []
    for check, (fn, _, _) in CONTRACT.items():
        for param in selected(check, found):
            fn(*param.values)
            ran.append(f"{check}[{param.id}]")
    return ran


# ---------------------------------------------------------------------------------------------------
# its rows in README's tables and its section in docs/schemes.md
# ---------------------------------------------------------------------------------------------------
def table(text: str, header: str) -> list:
    """The rows (lists of cells, ``\\|`` kept inside a cell) of the markdown table whose header line starts with
    ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def names_in(cell: str, registry) -> list:
    return [n for n in re.findall(r"`([^`]+)`", cell) if n in registry]


def readme_problems(readme: str, registry=None) -> list:
    """What README's two scheme tables say that the registry does not: the scheme table (scheme | kind | paper) has
    one row per scheme, its kind the scheme's (— for none) and its paper cell naming the first word of ``paper``; in
    the softmax | linear table every scheme is in one row of schemes alone, softmax takes it (causal only where the
    scheme is), linear attention takes it (✓) exactly where ``linear_ok``."""
    registry = REGISTRY if registry is None else registry
    problems = []
    rows = {}
    for cells in table(readme, "| scheme | kind | paper |"):
        named = re.fullmatch(r"`([^`]+)`", cells[0])
        if named:
            rows.setdefault(named.group(1), []).append(cells)
    for name in sorted(set(rows) | set(registry)):
        cls, found = registry.get(name), rows.get(name, [])
        if cls is None:
            problems.append(f"README's scheme table: `{name}` is no registered scheme")
            continue
        if len(found) != 1:
            problems.append(f"README's scheme table: {len(found)} rows for `{name}`, expected one")
            continue
        _, kind, paper = found[0]
        if not kind.startswith("—" if cls.kind == "none" else cls.kind):
            problems.append(f"README's scheme table: `{name}` is a {cls.kind} scheme, the table says {kind!r}")
        first = re.split(r"[\s,]+", cls.paper)[0]
        if first not in paper:
            problems.append(f"README's scheme table: `{name}`'s paper cell does not name {first!r} ({cls.paper})")
    alone = {}
    for cells in table(readme, "| scheme | softmax | linear |"):
        bare = re.sub(r"`([^`]+)`", lambda m: "" if m.group(1) in registry else m.group(0), cells[0])
        rest = re.sub(r"\([^)]*\)", "", bare).replace(",", "").strip()  # "(all variants)" is no other option
        if not rest and names_in(cells[0], registry):
            for name in names_in(cells[0], registry):
                alone.setdefault(name, []).append(cells)
    for name, cls in sorted(registry.items()):
        found = alone.get(name, [])
        if len(found) != 1:
            problems.append(f"README's softmax | linear table: {len(found)} rows of `{name}` alone, expected one")
            continue
        _, softmax, linear = found[0]
        if not softmax.startswith("✓") or ("causal only" in softmax) != bool(cls.causal_only):
            problems.append(f"README's softmax | linear table: `{name}`'s softmax cell {softmax!r}")
        if linear.startswith("✓") != cls.linear_ok:
            problems.append(
                f"README's softmax | linear table: `{name}`: linear_ok is {cls.linear_ok}, the table {linear!r}"
            )
    return problems


def schemes_md_problems(doc: str, registry=None) -> list:
    """What docs/schemes.md lacks: a section ``### `<name>` `` per scheme, and in its sharing table a row for every
    scheme that shares (``shares``), saying ``share: false`` is the default where it is; no row for an unknown name."""
    from linrope.base.options import defaults

    registry = REGISTRY if registry is None else registry
    problems = [f"docs/schemes.md: no section ### `{n}`" for n in sorted(registry) if f"\n### `{n}`\n" not in doc]
    rows = {}
    for cells in table(doc, "| scheme | what the paper / release shares across layers |"):
        named = re.fullmatch(r"`([^`]+)`", cells[0])
        if named:
            rows[named.group(1)] = cells
    problems += [f"docs/schemes.md's sharing table: `{n}` is no registered scheme" for n in rows if n not in registry]
    for name, cls in sorted(registry.items()):
        if cls.shares and name not in rows:
            problems.append(f"docs/schemes.md's sharing table: no row for `{name}`, which shares {cls.shares}")
        elif cls.shares and defaults(cls).get("share") is False and "`share: false` (default)" not in rows[name][2]:
            problems.append(f"docs/schemes.md's sharing table: `{name}` shares nothing by default (share: false)")
    return problems
