"""Position schemes (docs/schemes.md): pure torch, float64 where numerics matter, fresh random inputs.

The founding schemes' formulas, each against a loop over (b, h, i, j), their zero-parameter reductions to plain
attention, T5's buckets and ALiBi's slopes, TUPE's absolute term and FLOATER's ODE.  What every scheme owes (a
shift, the pairings, the attention path, tables, training, sharing, bf16, compile) is the contract suite's,
tests/positions/test_contract.py, read from the registry."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from linrope.models.attention import SoftmaxAttention
from linrope.models.model import TransformerLM
from linrope.positions import alibi_slopes, build_position, t5_bucket
from linrope.positions.deberta import log_bucket_distance
from tests.positions.contract import HD, D, H, attention, random_positions, tiny_lm


def plain(att, x, *, causal, scale):
    q, k, v = att.split(x)
    return att.merge(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))


def loop_attention(q, k, v, causal, score, value=None):
    """o_i = Σ_j softmax_j(score(b, h, i, j)) (v_j + value(i, j)), one element at a time."""
    B, Hh, N, _ = q.shape
    o = torch.zeros_like(v)
    for b in range(B):
        for h in range(Hh):
            for i in range(N):
                s = torch.stack(
                    [
                        score(b, h, i, j) if (j <= i or not causal) else torch.tensor(-math.inf, dtype=q.dtype)
                        for j in range(N)
                    ]
                )
                a = s.softmax(0)
                for j in range(N):
                    vj = v[b, h, j] if value is None else v[b, h, j] + value(h, i, j)
                    o[b, h, i] = o[b, h, i] + a[j] * vj
    return o


def sinusoid(r, dim, base=10000.0):
    """The sinusoidal encoding of one (possibly negative) distance, written out."""
    out = torch.zeros(dim, dtype=torch.float64)
    for t in range(0, dim, 2):
        out[t] = math.sin(r / base ** (t / dim))
        if t + 1 < dim:
            out[t + 1] = math.cos(r / base ** (t / dim))
    return out


# ---------------------------------------------------------------------------------------------------
# t5_bucket and alibi_slopes
# ---------------------------------------------------------------------------------------------------

PUBLISHED = [0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 8, 8, 9, 9, 9, 9, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11]


def test_t5_bucket_published_mapping_keys_behind():
    behind = -torch.arange(31)  # relative_position = j - i < 0: keys i - j = 0…30 behind the query
    assert t5_bucket(behind).tolist() == PUBLISHED


def test_t5_bucket_keys_ahead_use_the_other_half():
    ahead = torch.arange(1, 31)
    assert t5_bucket(ahead).tolist() == [b + 16 for b in PUBLISHED[1:]]
    assert t5_bucket(torch.tensor([0])).tolist() == [0]
    far = torch.tensor([500, 10_000])
    assert t5_bucket(far).tolist() == [31, 31] and t5_bucket(-far).tolist() == [15, 15]


def test_t5_bucket_one_sided():
    assert t5_bucket(torch.arange(1, 200), bidirectional=False).eq(0).all()  # keys ahead -> bucket 0
    n = torch.arange(0, 400)
    got = t5_bucket(-n, bidirectional=False).tolist()
    # exact below 16, then 16 + floor(log(n/16)/log(128/16) · 16), clipped at 31
    want = [m if m < 16 else min(31, 16 + math.floor(math.log(m / 16) / math.log(8) * 16)) for m in range(400)]
    assert got == want
    assert got[:16] == list(range(16)) and got[16] == 16 and got[127] == 31 and got[399] == 31
    # the other options follow the same rule: 8 buckets, max distance 16 -> exact below 4
    small = t5_bucket(-torch.arange(20), bidirectional=False, num_buckets=8, max_distance=16).tolist()
    assert small == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7]


def test_t5_bucket_any_shape_and_dtype():
    rel = torch.randint(-300, 300, (3, 4, 5), dtype=torch.int32)
    b = t5_bucket(rel)
    assert b.shape == rel.shape and b.dtype == torch.long and b.min() >= 0 and b.max() <= 31


def test_alibi_slopes():
    assert torch.equal(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)], dtype=torch.float64))
    assert alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope: 2^-1, 2^-3
    assert alibi_slopes(6).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8]
    # 12 heads: the 8-head slopes, then every other 16-head slope (2^-k/2, k = 1, 3, 5, 7)
    want12 = [2.0 ** -(h + 1) for h in range(8)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(want12, dtype=torch.float64), rtol=1e-14, atol=0)
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256], dtype=torch.float64))
    assert alibi_slopes(1).tolist() == [2.0**-8]
    with pytest.raises(ValueError):
        alibi_slopes(0)


def test_alibi_bias_matrix_and_linear_decay():
    pos = build_position("alibi", where="attention", d_model=D, n_heads=2, head_dim=HD, max_len=8, causal=False)
    positions = torch.tensor([5, 6, 7])  # offset: only differences matter
    q = torch.randn(1, 2, 3, HD, dtype=torch.float64)
    bias = pos.score_bias(q, q, positions)
    dist = torch.tensor([[0, 1, 2], [1, 0, 1], [2, 1, 0]], dtype=torch.float64)
    want = -torch.stack([dist * 2.0**-4, dist * 2.0**-8])[None]  # H = 2: m = 2^-4, 2^-8
    torch.testing.assert_close(bias, want)
    torch.testing.assert_close(pos.linear_decay().double(), torch.exp(-alibi_slopes(2)), rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------------------------------
# TUPE: a relative bucket bias and an absolute term
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_tupe_relative_part_ignores_a_shift(causal):
    """With its absolute term zeroed (U_Q), TUPE is its bucket bias: only differences of positions matter."""
    att = attention("tupe", causal=causal)
    zero(att.pos, "u_q")
    x = torch.randn(2, 12, D, dtype=torch.float64)
    positions = random_positions(12)
    shift = int(torch.randint(1, 60, ()))
    out = att(x, positions)[0]
    torch.testing.assert_close(att(x, positions + shift)[0], out, rtol=1e-9, atol=1e-9)
    near = torch.arange(12)  # the bucket bias matters: other distances, other output
    assert not torch.allclose(att(x, near * 2)[0], att(x, near)[0], atol=1e-6)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_tupe_absolute_term_sees_the_shift(causal):
    att = attention("tupe", causal=causal)
    x = torch.randn(2, 10, D, dtype=torch.float64)
    positions = torch.arange(10)
    assert (att(x, positions + 7)[0] - att(x, positions)[0]).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------------
# zero position parameters: plain attention (at the scheme's own scale)
# ---------------------------------------------------------------------------------------------------


def zero(scheme, *names):
    """Zero the named parameters (or every parameter of a named submodule) of a scheme."""
    with torch.no_grad():
        for n in names:
            obj = getattr(scheme, n)
            for p in obj.parameters() if isinstance(obj, torch.nn.Module) else [obj]:
                p.zero_()


ZERO_CASES = [  # (name, options, parameters zeroed, score scale that remains)
    ("t5", {}, ("bias",), 1 / math.sqrt(HD)),
    ("shaw", {}, ("key_table", "value_table"), 1 / math.sqrt(HD)),
    ("shaw", {"variant": "relative_key"}, ("key_table",), 1 / math.sqrt(HD)),
    ("shaw", {"variant": "relative_key_query"}, ("key_table",), 1 / math.sqrt(HD)),
    ("xl", {}, ("w_r", "u"), 1 / math.sqrt(HD)),  # v stays random: v·W_R R vanishes with W_R
    ("deberta", {"k": 4}, ("w_kr", "w_qr"), 1 / math.sqrt(3 * HD)),  # P stays random
    ("tupe", {}, ("u_q", "bias"), 1 / math.sqrt(2 * HD)),  # p, its layer norm and U_K stay random
]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize(
    "name,opts,zeroed,scale", ZERO_CASES, ids=[f"{c[0]}-{c[1].get('variant', '')}" for c in ZERO_CASES]
)
def test_zero_parameters_reduce_to_plain_attention(name, opts, zeroed, scale, causal):
    att = attention(name, causal=causal, **opts)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    positions = torch.arange(9) + 11
    assert not torch.allclose(att(x, positions)[0], plain(att, x, causal=causal, scale=scale), atol=1e-6)
    zero(att.pos, *zeroed)
    torch.testing.assert_close(att(x, positions)[0], plain(att, x, causal=causal, scale=scale), rtol=1e-10, atol=1e-12)


def test_input_schemes_with_zero_parameters_leave_x_alone():
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = torch.arange(7) + 3
    dims = dict(where="input", d_model=D, n_heads=H, head_dim=HD, max_len=32)
    fl = build_position("floater", **dims).double()
    with torch.no_grad():
        fl.p0.zero_(), fl.w2.zero_(), fl.b2.zero_()
    torch.testing.assert_close(fl.embed(x, positions), x)
    torch.testing.assert_close(build_position("multiplicative", scale=0.0, **dims).embed(x, positions), x)
    ml = build_position("multiplicative", table="learned", **dims).double()
    assert not torch.allclose(ml.embed(x, positions), x)
    with torch.no_grad():
        ml.table.zero_()
    torch.testing.assert_close(ml.embed(x, positions), x)


# ---------------------------------------------------------------------------------------------------
# each formula against a loop over (b, h, i, j)
# ---------------------------------------------------------------------------------------------------


def loop_check(att, score, value=None, *, n=5, offset=7, causal=True):
    x = torch.randn(2, n, D, dtype=torch.float64)
    positions = torch.arange(n) + offset
    q, k, v = att.split(x)
    want = att.merge(
        loop_attention(
            q,
            k,
            v,
            causal,
            lambda b, h, i, j: score(q, k, positions, b, h, i, j),
            None if value is None else lambda h, i, j: value(positions, h, i, j),
        )
    )
    torch.testing.assert_close(att(x, positions)[0], want, rtol=1e-9, atol=1e-10)


def test_shaw_clipping_table_index():
    pos = build_position("shaw", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=16, k=2)
    want = torch.tensor(
        [[2, 1, 0, 0, 0], [3, 2, 1, 0, 0], [4, 3, 2, 1, 0], [4, 4, 3, 2, 1], [4, 4, 4, 3, 2]]
    )  # clip(i - j, -2, 2) + 2
    assert torch.equal(pos.table_index(torch.arange(5) + 40), want)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_shaw_formula(causal):
    att = attention("shaw", causal=causal, k=2)
    kt, vt = att.pos.key_table, att.pos.value_table

    def r(p, i, j):
        return int(max(-2, min(2, int(p[i] - p[j])))) + 2

    def score(q, k, p, b, h, i, j):
        return q[b, h, i] @ (k[b, h, j] + kt[r(p, i, j)]) / math.sqrt(HD)

    loop_check(att, score, lambda p, h, i, j: vt[r(p, i, j)], causal=causal)


@pytest.mark.parametrize("variant", ["relative_key", "relative_key_query"])
def test_shaw_variant_formula(variant):
    att = attention("shaw", causal=False, variant=variant, max_len=16)
    assert not att.pos.has_value_term and not hasattr(att.pos, "value_table")
    table = att.pos.key_table
    assert table.shape[0] == 2 * 16 - 1

    def score(q, k, p, b, h, i, j):
        d = table[int(p[i] - p[j]) + 15]  # D_{i-j}, no clipping inside max_len
        s = q[b, h, i] @ k[b, h, j] + q[b, h, i] @ d
        if variant == "relative_key_query":
            s = s + k[b, h, j] @ d
        return s / math.sqrt(HD)

    loop_check(att, score, causal=False)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_xl_four_terms(causal):
    att = attention("xl", causal=causal)
    w_r, u, vb = att.pos.w_r, att.pos.u, att.pos.v

    def score(q, k, p, b, h, i, j):
        wr = (sinusoid(int(p[i] - p[j]), D) @ w_r)[h * HD : (h + 1) * HD]  # W_R R_{i-j}, head h
        return (q[b, h, i] @ k[b, h, j] + q[b, h, i] @ wr + u[h] @ k[b, h, j] + vb[h] @ wr) / math.sqrt(HD)

    x = torch.randn(2, 5, D, dtype=torch.float64)
    positions = torch.arange(5) + 7
    q, k, v = att.split(x)
    want = att.merge(loop_attention(q, k, v, causal, lambda b, h, i, j: score(q, k, positions, b, h, i, j)))
    # R comes from the float32 sinusoidal table (angles in float64): agreement to float32 precision
    torch.testing.assert_close(att(x, positions)[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_t5_formula(causal):
    att = attention("t5", causal=causal, num_buckets=8, max_distance=16)
    beta = att.pos.bias  # (buckets, H)

    def score(q, k, p, b, h, i, j):
        bucket = t5_bucket(torch.tensor(int(p[j] - p[i])), bidirectional=not causal, num_buckets=8, max_distance=16)
        return q[b, h, i] @ k[b, h, j] / math.sqrt(HD) + beta[int(bucket), h]

    loop_check(att, score, n=6, causal=causal)


def release_log_bucket(r: int, k: int, max_distance: int) -> int:
    """DeBERTa-v2's make_log_bucket_position for one distance, in float64, written from its definition."""
    mid = k // 2
    if abs(r) <= mid:
        return r
    far = mid + math.ceil(math.log(abs(r) / mid) / math.log((max_distance - 1) / mid) * (mid - 1))
    return int(math.copysign(far, r))


def deberta_row(a: int, b: int, kk: int, log_buckets: bool = False, max_distance: int = 0) -> int:
    """The table row of distance a - b: clip(bucket(a - b), -k, k - 1) + k."""
    r = release_log_bucket(a - b, kk, max_distance) if log_buckets else a - b
    return max(-kk, min(kk - 1, r)) + kk


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("p2c", ["release", "paper"])
@pytest.mark.parametrize(
    "opts", [{"k": 2}, {"k": 4, "log_buckets": True, "max_distance": 7}], ids=["clip", "log_buckets"]
)
def test_deberta_disentangled_formula(causal, p2c, opts):
    kk = opts["k"]
    att = attention("deberta", causal=causal, p2c=p2c, **opts)
    k_r = att.pos.table @ att.pos.w_kr  # (2k, H·d)
    q_r = att.pos.table @ att.pos.w_qr

    def row(a, b_):
        return deberta_row(a, b_, kk, opts.get("log_buckets", False), opts.get("max_distance", 0))

    def score(q, k, p, b, h, i, j):
        sl = slice(h * HD, (h + 1) * HD)
        pi, pj = int(p[i]), int(p[j])
        c2p = q[b, h, i] @ k_r[row(pi, pj), sl]  # q_i·K^r_{δ(i,j)}
        # p2c: the release reads row δ(i, j) (as the released code computes it), the paper row δ(j, i)
        p2c_row = row(pi, pj) if p2c == "release" else row(pj, pi)
        return (q[b, h, i] @ k[b, h, j] + c2p + k[b, h, j] @ q_r[p2c_row, sl]) / math.sqrt(3 * HD)

    loop_check(att, score, n=9, causal=causal)


def test_deberta_p2c_default_is_the_release_and_the_forms_differ():
    assert build_position("deberta", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=8).p2c == "release"
    release, paper = attention("deberta", k=4), attention("deberta", k=4, p2c="paper")
    paper.load_state_dict(release.state_dict())
    x = torch.randn(2, 7, D, dtype=torch.float64)
    assert (release(x, torch.arange(7))[0] - paper(x, torch.arange(7))[0]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="p2c=both: expected one of release, paper"):
        attention("deberta", p2c="both")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_tupe_untied_formula(causal):
    att = attention("tupe", causal=causal, num_buckets=8, max_distance=16)
    s = att.pos
    w, c, beta = s.ln.weight, s.ln.bias, s.bias

    def normed(i):  # the layer norm of p_i, written out (biased variance, eps 1e-5)
        p = s.table[i]
        return (p - p.mean()) / torch.sqrt(p.var(unbiased=False) + 1e-5) * w + c

    def score(q, k, p, b, h, i, j):
        sl = slice(h * HD, (h + 1) * HD)
        pq = (normed(p[i]) @ s.u_q.weight.T + s.u_q.bias)[sl]
        pk = (normed(p[j]) @ s.u_k.weight.T + s.u_k.bias)[sl]
        bucket = t5_bucket(torch.tensor(int(p[j] - p[i])), bidirectional=not causal, num_buckets=8, max_distance=16)
        return (q[b, h, i] @ k[b, h, j] + pq @ pk) / math.sqrt(2 * HD) + beta[int(bucket), h]

    loop_check(att, score, causal=causal)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_alibi_formula(causal):
    att = attention("alibi", causal=causal)
    m = alibi_slopes(H)

    def score(q, k, p, b, h, i, j):
        return q[b, h, i] @ k[b, h, j] / math.sqrt(HD) - m[h] * abs(int(p[i] - p[j]))

    loop_check(att, score, causal=causal)


@pytest.mark.parametrize("k,max_distance", [(128, 512), (256, 512), (8, 32), (16, 53), (4, 7), (64, 1000), (32, 33)])
def test_deberta_log_buckets_match_the_release(k, max_distance):
    r = torch.arange(-3000, 3001)
    got = log_bucket_distance(r, k, max_distance)
    want = torch.tensor([release_log_bucket(int(x), k, max_distance) for x in r])
    off = got != want
    # the release computes in float32: it may differ from float64 only where the quotient sits on an integer
    mid = k // 2
    for x in r[off].tolist():
        q = math.log(abs(x) / mid) / math.log((max_distance - 1) / mid) * (mid - 1)
        assert abs(q - round(q)) < 1e-5 * max(1.0, abs(q)), (x, q)
    assert off.sum() <= 2
    assert torch.equal(got[r.abs() <= mid], r[r.abs() <= mid])  # exact within ±k/2
    assert torch.equal(got, -got.flip(0))  # odd in r
    ahead = got[r >= 0]
    assert (ahead[1:] >= ahead[:-1]).all()  # monotone
    assert got[r == max_distance - 1].item() == k - 1  # max_distance - 1 reaches the last row of the right half


def test_deberta_log_buckets_use_every_row():
    """k = 128, max distance 512: the far left reaches row 0 and the far right row 2k-1, and every distance of
    the window lands where the release puts it (47 of these 1025 landed one row off before)."""
    pos = build_position(
        "deberta",
        where="attention",
        d_model=D,
        n_heads=H,
        head_dim=HD,
        max_len=8,
        k=128,
        log_buckets=True,
        max_distance=512,
    )
    rows = pos.delta(torch.arange(513))  # i - j over -512 … 512
    assert rows.min() == 0 and rows.max() == 255
    want = torch.tensor([deberta_row(i, j, 128, True, 512) for i in range(0, 513, 8) for j in range(513)])
    assert torch.equal(rows[::8].reshape(-1), want)
    with pytest.raises(ValueError, match="max_distance"):
        build_position(
            "deberta",
            where="attention",
            d_model=D,
            n_heads=H,
            head_dim=HD,
            max_len=8,
            k=8,
            log_buckets=True,
            max_distance=5,
        )


# ---------------------------------------------------------------------------------------------------
# Shaw's value term
# ---------------------------------------------------------------------------------------------------


def test_shaw_value_term_uses_the_dropped_weights():
    """Every v_j = v and every a^V row = -v: o_i = Σ_j a'_ij (v_j + a^V_ij) = 0 whatever dropout keeps,
    but only if the value term sees the same dropped weights a' as the v_j do."""
    pos = build_position("shaw", where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=16, k=2)
    att = SoftmaxAttention(D, H, pos, causal=True, dropout=0.5).double().train()
    x = torch.randn(1, 1, D, dtype=torch.float64).expand(2, 8, D)  # identical rows: identical v_j
    with torch.no_grad():
        v_rows = att.qkv.weight[2 * D :].view(H, HD, D)  # the v projection, head by head
        v_rows[1:] = v_rows[0]  # every head the same v
        v = att.split(x)[2][0, 0, 0]
        att.pos.key_table.normal_()  # non-uniform attention
        att.pos.value_table.copy_(-v.expand_as(att.pos.value_table))
    out = att(x, torch.arange(8))[0]
    torch.testing.assert_close(out, torch.zeros_like(out), atol=1e-12, rtol=0)
    att.eval()
    with torch.no_grad():
        att.pos.value_table.zero_()
    assert att(x, torch.arange(8))[0].abs().max() > 1e-6  # the check above is not vacuous


# ---------------------------------------------------------------------------------------------------
# floater
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "causal, options, line",
    [
        (True, {"max_distance": 16}, "max_distance=16 must exceed the 16 exact buckets"),
        (True, {"max_distance": 8}, "max_distance=8 must exceed the 16 exact buckets"),
        (False, {"max_distance": 8}, r"max_distance=8 must exceed the 8 exact buckets \(bidirectional"),
        (False, {"num_buckets": 3}, "num_buckets=3 is too few .* at least 4"),
        (True, {"num_buckets": 1}, "num_buckets=1 is too few .* at least 2"),
        (True, {"num_buckets": 8, "max_distance": 2, "bidirectional": True}, "max_distance=2 must exceed the 2 "),
    ],
)
@pytest.mark.parametrize("scheme", ["t5", "tupe"])
def test_t5_buckets_a_model_cannot_have_are_refused_in_one_line(scheme, causal, options, line):
    """max_distance at or below the exact buckets made the log-spaced buckets negative (wrapping to the table's last
    rows) or an index error; too few buckets divided by zero. Refused at the config check and at build, and by
    t5_bucket itself; the published defaults pass both ways."""
    from linrope.models.spec import ModelConfig

    model = dict(d_model=D, n_heads=H, max_len=64, causal=causal, position={"name": scheme, **options})
    (problem,) = ModelConfig.from_dict(model).problems()
    assert re.search(line, problem) and "\n" not in problem, problem
    with pytest.raises(ValueError, match=line):
        build_position(scheme, where="attention", d_model=D, n_heads=H, head_dim=HD, max_len=64, causal=causal,
                       **options)  # fmt: skip
    for causal in (True, False):
        assert not ModelConfig.from_dict({**model, "causal": causal, "position": {"name": scheme}}).problems()
    with pytest.raises(ValueError, match="max_distance=8 must exceed"):
        t5_bucket(-torch.arange(40), bidirectional=False, max_distance=8)


@pytest.mark.parametrize(
    "position, causal, line",
    [
        ({"name": "xpos", "blockwise": True}, False, "blockwise is the paper's blockwise \\*causal\\* attention"),
        ({"name": "rope", "rotary_fraction": 0.375}, True, r"rotary_fraction=0.375 rotates int\(8·0.375\) = 3"),
        ({"name": "rope", "scaling": "dynamic", "factor": 2.0, "max_position": 128}, True, "dynamic with max_posit"),
        ({"name": "floater", "method": "rk5"}, True, "method=rk5: expected one of dopri8, .*rk4"),
    ],
)
def test_options_that_failed_at_build_or_first_forward_are_refused_at_the_check(position, causal, line):
    """Each passed the config check, then failed when the model was built or at its first forward."""
    from linrope.models.spec import ModelConfig

    model = dict(d_model=D, n_heads=H, max_len=64, causal=causal, position=position)
    (problem,) = ModelConfig.from_dict(model).problems()
    assert re.search(line, problem), problem


def floater(**opts):
    return build_position("floater", where="input", d_model=D, n_heads=H, head_dim=HD, max_len=8, **opts).double()


def test_floater_is_smooth_in_t():
    fl = floater()
    p = fl.encodings(torch.arange(80), torch.float64)
    d1 = p[1:] - p[:-1]
    d2 = d1[1:] - d1[:-1]
    assert d1.norm(dim=-1).min() > 1e-3  # it moves: distinct positions get distinct vectors
    assert (d2.norm(dim=-1) / d1[1:].norm(dim=-1)).max() < 0.2  # and turns slowly
    assert p.abs().max() < 20  # bounded over 80 positions
    rough = torch.randn(80, D, dtype=torch.float64)  # a table of independent rows, for contrast
    r1 = rough[1:] - rough[:-1]
    assert ((r1[1:] - r1[:-1]).norm(dim=-1) / r1[1:].norm(dim=-1)).median() > 1.0


def test_floater_any_positions_and_solvers_agree():
    fl = floater()
    full = fl.encodings(torch.arange(41), torch.float64)
    picked = torch.tensor([40, 5, 5, 17])  # unsorted, repeated, not starting at 0
    torch.testing.assert_close(fl.encodings(picked, torch.float64), full[picked], rtol=1e-8, atol=1e-8)
    adaptive = floater(method="dopri5", rtol=1e-7, atol=1e-9)
    adaptive.load_state_dict(fl.state_dict())
    torch.testing.assert_close(adaptive.encodings(picked, torch.float64), full[picked], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=">= 0"):
        fl.encodings(torch.tensor([-1, 2]))


def test_floater_solves_in_float32_under_bf16_autocast():
    """The ODE is solved in the compute dtype with autocast off, as FIRE and CoPE are: under bf16 autocast its
    matmuls ran in bf16, and by position 1023 the trajectory was a different one (4.4 away)."""
    fl = build_position("floater", where="input", d_model=D, n_heads=H, head_dim=HD, max_len=8)
    positions = torch.arange(0, 1024, 31)
    exact = fl.double().encodings(positions, torch.float64)
    fl.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = fl.encodings(positions, torch.float32)
    assert got.dtype == torch.float32 and (got.double() - exact).abs().max() < 1e-3


def test_floater_gradients_reach_the_ode():
    fl = floater()
    x = torch.randn(2, 12, D, dtype=torch.float64)
    (fl.embed(x, torch.arange(12) + 3) * torch.randn(2, 12, D, dtype=torch.float64)).sum().backward()
    for name in ("p0", "w1", "b1", "w2", "b2"):
        g = getattr(fl, name).grad
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name
    assert fl.w1.grad[-1].abs().sum() > 0  # the time input too


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_rope_position_interpolation_through_the_scheme(causal):
    """pi with factor 2 is plain RoPE at positions m / 2; ntk changes the frequencies, not the positions."""
    plain_rope, pi = attention("rope", causal=causal), attention("rope", causal=causal, scaling="pi", factor=2.0)
    ntk = attention("rope", causal=causal, scaling="ntk", factor=2.0)
    for other in (pi, ntk):
        other.load_state_dict(plain_rope.state_dict())
    x = torch.randn(2, 9, D, dtype=torch.float64)
    positions = random_positions(9)
    torch.testing.assert_close(pi(x, 2 * positions)[0], plain_rope(x, positions)[0], rtol=1e-9, atol=1e-9)
    assert not torch.allclose(ntk(x, positions)[0], plain_rope(x, positions)[0], atol=1e-6)
    torch.testing.assert_close(ntk(x, positions + 13)[0], ntk(x, positions)[0], rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------------
# initial scale of the learned table; ALiBi's precision
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("d_model", [64, 256])
def test_learned_positions_start_at_the_size_of_the_tokens(d_model):
    """BERT's release starts token and position tables at the same std and adds them unscaled (ratio 1);
    here the tokens are scaled by sqrt(d_model), so the table starts that much larger."""
    torch.manual_seed(0)
    m = TransformerLM(
        dict(vocab_size=256, d_model=d_model, n_layers=1, n_heads=4, d_ff=64, max_len=256, position={"name": "learned"})
    )
    tokens = m.embed.weight * m.embed_scale
    ratio = m.pos.table.detach().pow(2).mean().sqrt() / tokens.detach().pow(2).mean().sqrt()
    assert abs(float(ratio) - 1.0) < 0.03
    x = torch.randint(0, 256, (2, 200))  # and so in the summed input
    term_tok = (m.embed(x) * m.embed_scale).detach().pow(2).mean().sqrt()
    term_pos = m.pos.embed(torch.zeros(1, 200, d_model), torch.arange(200)).detach().pow(2).mean().sqrt()
    assert abs(float(term_pos / term_tok) - 1.0) < 0.05
    small = build_position(
        "learned", where="input", d_model=d_model, n_heads=4, head_dim=d_model // 4, max_len=256, init_std=0.02
    )
    assert abs(float(small.table.std()) - 0.02) < 0.002  # an explicit init_std still wins


def test_alibi_slopes_stay_float64_and_the_bias_is_exact():
    pos = build_position("alibi", where="attention", d_model=48, n_heads=12, head_dim=4, max_len=8)
    for convert in (lambda m: m.float(), lambda m: m.bfloat16(), lambda m: m.half(), lambda m: m.to("cpu")):
        assert convert(pos).slopes.dtype == torch.float64
    torch.testing.assert_close(pos.slopes, alibi_slopes(12), rtol=0, atol=0)
    positions = torch.arange(1000) + 5
    want = torch.stack(
        [-alibi_slopes(12)[h] * (positions[:, None] - positions[None, :]).abs().double() for h in range(12)]
    )[None]
    q64 = torch.zeros(1, 12, 1, 4, dtype=torch.float64)
    assert torch.equal(pos.score_bias(q64, q64, positions), want)  # float64 scores: exact
    q32 = q64.float()
    assert torch.equal(pos.score_bias(q32, q32, positions), want.float())  # float32: rounded once
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(1, 1000, 48)
        qb = torch.nn.Linear(48, 48)(x)  # what q is under autocast
        assert qb.dtype == torch.bfloat16
        bias = pos.score_bias(qb, qb, positions)
    assert bias.dtype == torch.float32 and torch.equal(bias, want.float())  # not rounded to bf16


def test_floater_every_block_injection_shares_one_solve(monkeypatch):
    """inject: blocks adds the same p(i·Δ) to the input of every block (one ODE for all blocks, solved once)."""
    torch.manual_seed(0)
    every = tiny_lm("floater", inject="blocks").double()
    once = tiny_lm("floater").double()
    once.load_state_dict(every.state_dict())
    assert every.num_params() == once.num_params()
    x = torch.randint(0, 32, (2, 10))
    positions = torch.arange(10) + 3
    p = every.pos.encodings(positions, torch.float64)
    h = every.embed(x) * every.embed_scale + p  # the model written out, block by block
    for i, block in enumerate(every.blocks):
        h = block(h + p if i else h, positions)[0]
    torch.testing.assert_close(every(x, positions), every.head(every.ln_f(h)), rtol=1e-10, atol=1e-10)
    assert (every(x, positions) - once(x, positions)).abs().max() > 1e-3
    solves = []
    original = type(every.pos).encodings
    monkeypatch.setattr(type(every.pos), "encodings", lambda self, *a: solves.append(1) or original(self, *a))
    every(x, positions)
    assert len(solves) == 1
    with pytest.raises(ValueError, match="inject=attention: expected one of input, blocks"):
        tiny_lm("floater", inject="attention")
