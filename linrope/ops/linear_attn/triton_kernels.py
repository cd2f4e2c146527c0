"""linrope's own Triton kernels for causal linear attention (``impl="triton"``; the operators are triton_backend.py's,
the mathematics docs/mathematics.md, "Triton kernels").  Imported only when a call runs them.

Every kernel reads q, k, v, do in any strides (a (B, N, H, d) tensor's transposed view: no copies) and applies φ
and RoPE to the tiles it loads (``_features``): the features never reach global memory.  Chunks of BT = 64
positions; g = log γ, b_i = (i + 1) g, every power of γ exp of a difference <= 0 (``_weights``).  H_c, z_c, the
state before chunk c, live in slot c of a float32 buffer of NT + 1 slots per (batch, head) (``_slot``; slot NT the
state after the last chunk); in the backward slot c holds the gradient of the state before chunk c.  The cosine
map's constant feature is no column of the tiles: its row of H and entry of z are carried apart, the scores + 1.

Kernels (grid; what each program does):
    _chunk_state   (NT, B·H)   chunk c's own part of H_c+1 (and z) into slot c + 1, exp(L g) into the gate
    _scan          (⌈W/BW⌉, B·H)  H_c+1 = exp(L g) H_c + that part, in place down the slots (or, in reverse, the
                               gradients'): elementwise in the state's W entries, U slots a step
    _out_fwd       (NT, B·H)   one chunk: the output and the (guarded) denominator, stored for the backward
    _chunk_dstate  (NT, B·H)   ∂L/∂den (into dd) and chunk c's own part of the gradient of H_c, into slot c
    _grad          (NT, B·H)   one chunk: dq, dk, dv from the recomputed states and the state gradients
    _state_fwd, _dden, _state_bwd   ``triton_backend.SCAN = "loop"``: the states summed by one sequential program per
                               (batch, head, value block) instead, each chunk's features and product in the loop
The backward keeps nothing of the forward but out and den: the states are computed again.  Blocks are 64 wide at
least (Hopper miscompiles multi-dot kernels with 16/32-wide blocks, fla_backend.py).  The kernels over chunks are
autotuned over num_warps (``_warps``); _scan is not (in place: the autotuner's timing runs would sum twice).
"""

import os

import triton
import triton.language as tl

# A global a compiled kernel reads must be a tl.constexpr (a plain float fails to compile: benchmarks/triton_compile.py)
BT = 64  # chunk length
DEN_FLOOR = tl.constexpr(1e-2)  # common.DEN_FLOOR (the guard of placement "both")
TINY = tl.constexpr(1.0842021724855044e-19)  # torch.finfo(torch.float32).tiny ** 0.5: features.phi's clamp of ‖x‖


def _warps(*counts: int, norm: bool = True):
    """Triton's autotuner over num_warps: the device times each count on its first call for a key (registers and
    spills of each: benchmarks/triton_compile.py).  Under Triton's interpreter (``TRITON_INTERPRET=1``, read at
    import, as triton.jit reads it) only the first: there is no device to time on."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        counts = counts[:1]
    key = ["D", "DV", "COS", "ROPE", "HAS_G", "DOCS"] + ["NORM"] * norm
    return triton.autotune([triton.Config({}, num_warps=w) for w in counts], key=key)


@triton.jit
def _base(i_bh, H, s_b, s_h):
    """The int64 offset of batch row i_bh // H, head i_bh % H."""
    return (i_bh // H).to(tl.int64) * s_b + (i_bh % H).to(tl.int64) * s_h


@triton.jit
def _slot(st, i_bh, NT, c, D, DV, ONE: tl.constexpr):
    """(H, z) pointers of slot c of batch row and head i_bh in a state buffer (B·H, NT + 1, W): H the (D', d_v)
    matrix, its row 0 the cosine map's constant feature's (``ONE``), then z (D',); W = D'·d_v + D'."""
    p = st + (i_bh.to(tl.int64) * (NT + 1) + c) * ((D + ONE) * (DV + 1))
    return p, p + (D + ONE) * DV


@triton.jit
def _put(hp, zp, b_h, b_z, b_h1, b_z1, rk, cv, D, DV, ZD, ONE: tl.constexpr, COS: tl.constexpr):
    """Store a state or its gradient: H's rows of the features (columns cv) at hp ((D', d_v), row stride d_v, as in a
    slot and in S0), z's first ZD at zp (D, or 0 where another value block's program stores z), with COS the constant
    feature's row b_h1 and entry b_z1."""
    km, vm = rk < D, cv < DV
    tl.store(hp + (ONE + rk)[:, None] * DV + cv[None, :], b_h, mask=km[:, None] & vm[None, :])
    tl.store(zp + ONE + rk, b_z, mask=rk < ZD)
    if COS:
        tl.store(hp + cv, b_h1, mask=vm)
        tl.store(zp, b_z1, mask=ZD > 0)


@triton.jit
def _get(hp, zp, rk, cv, D, DV, ONE: tl.constexpr, COS: tl.constexpr):
    """(H's feature rows, z, H's constant row, z's constant entry: 0 without COS) of a state as ``_put`` stores it."""
    km, vm = rk < D, cv < DV
    h = tl.load(hp + (ONE + rk)[:, None] * DV + cv[None, :], mask=km[:, None] & vm[None, :], other=0.0)
    h1, z1 = tl.zeros(cv.shape, dtype=tl.float32), tl.sum(tl.zeros(cv.shape, dtype=tl.float32), 0)
    if COS:
        h1, z1 = tl.load(hp + cv, mask=vm, other=0.0), tl.load(zp)
    return h, tl.load(zp + ONE + rk, mask=km, other=0.0), h1, z1


@triton.jit
def _tile(ptr, s_n, s_d, t0, N, W, BT: tl.constexpr, BW: tl.constexpr):
    """Rows t0 … t0+BT-1, columns 0 … BW-1 of a (N, W) matrix in float32, zero outside."""
    r, c = t0 + tl.arange(0, BT), tl.arange(0, BW)
    m = (r < N)[:, None] & (c < W)[None, :]
    return tl.load(ptr + r[:, None] * s_n + c[None, :] * s_d, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _rows(ptr, t0, N, BT: tl.constexpr, other):
    r = t0 + tl.arange(0, BT)
    return tl.load(ptr + r, mask=r < N, other=other).to(tl.float32)


@triton.jit
def _rotate(x, cos, sin, BT: tl.constexpr, BK: tl.constexpr):
    """Interleaved RoPE on a (BT, BK) tile: the pair (x[2t], x[2t+1]) turned by the angle of (cos, sin)[:, t]."""
    a, b = tl.split(tl.reshape(x, (BT, BK // 2, 2)))
    return tl.reshape(tl.join(a * cos - b * sin, b * cos + a * sin), (BT, BK))


@triton.jit
def _table(cs, t0, N, D, BT: tl.constexpr, BK: tl.constexpr):
    """cos and sin (BT, BK/2) of positions t0 … from the (N, D/2, 2) float32 table."""
    r, c = t0 + tl.arange(0, BT), tl.arange(0, BK // 2)
    m = (r < N)[:, None] & (c < D // 2)[None, :]
    p = cs + r[:, None].to(tl.int64) * D + 2 * c[None, :]
    return tl.load(p, mask=m, other=0.0), tl.load(p + 1, mask=m, other=0.0)


@triton.jit
def _phi(x, t0, N, D, COS: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """φ without its constant feature (elu+1, or x/‖x‖ for cosine), zero outside the rows and columns."""
    r, c = t0 + tl.arange(0, BT), tl.arange(0, BK)
    m = (r < N)[:, None] & (c < D)[None, :]
    if COS:
        f = x / tl.maximum(tl.sqrt(tl.sum(x * x, 1)), TINY)[:, None]
    else:
        f = tl.where(x > 0, x + 1.0, tl.exp(x))
    return tl.where(m, f, 0.0)


@triton.jit
def _features(x, cs, t0, N, D, COS: tl.constexpr, ROPE: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr):
    """(φ, the numerator's features, the denominator's) of a loaded tile x.  ROPE: 0 none, 1 numerator, 2 both."""
    f = _phi(x, t0, N, D, COS, BT, BK)
    if ROPE == 0:
        return f, f, f
    cos, sin = _table(cs, t0, N, D, BT, BK)
    fn = _rotate(f, cos, sin, BT, BK)
    if ROPE == 1:
        return f, fn, f
    return f, fn, fn


@triton.jit
def _weights(t0, N, g, docs, i_bh, H, HAS_G: tl.constexpr, DOCS: tl.constexpr, BT: tl.constexpr):
    """(M (BT, BT), exp(b_i), exp((L-1-j) g) (0 past the end), exp(L g)) of the chunk at t0.  With packed documents
    (ids non-decreasing along a row) each is 0 across a boundary: M between documents, exp(b_i) for a query after a
    boundary in the chunk (it does not read the state entering it), the key weight for a key before one (it does not
    enter the state leaving it), exp(L g) for a chunk that holds one (the state is not carried across it)."""
    i = tl.arange(0, BT)
    ok = (t0 + i) < N
    L = tl.minimum(N - t0, BT)
    causal = i[:, None] >= i[None, :]
    if HAS_G:
        b = (i + 1).to(tl.float32) * g
        M = tl.where(causal, tl.exp(b[:, None] - b[None, :]), 0.0)
        eb = tl.where(ok, tl.exp(b), 0.0)
        w = tl.where(ok, tl.exp(L.to(tl.float32) * g - b), 0.0)
        gL = tl.exp(L.to(tl.float32) * g)
    else:
        M, eb, gL = tl.where(causal, 1.0, 0.0), tl.where(ok, 1.0, 0.0), 1.0
        w = eb
    if DOCS:
        db = docs + (i_bh // H).to(tl.int64) * N
        di = tl.load(db + t0 + i, mask=ok, other=-1)
        prev = tl.load(db + tl.maximum(t0 - 1, 0))  # the position before the chunk (the row's first: the state)
        last = tl.load(db + t0 + L - 1)
        M = tl.where(di[:, None] == di[None, :], M, 0.0)
        eb = tl.where(di == prev, eb, 0.0)
        w = tl.where(di == last, w, 0.0)
        gL = tl.where(last == prev, gL, 0.0)
    return M, eb, w, gL


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """A float32 product (operands float32: tf32 or ieee by PREC)."""
    return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)


@triton.jit
def _lp(a, b, DT: tl.constexpr, PREC: tl.constexpr):
    """A product over chunk positions, operands in DT (bfloat16 for bfloat16 inputs, else float32), float32 sum."""
    if DT == tl.float32:
        return tl.dot(a, b, input_precision=PREC)
    return tl.dot(a.to(DT), b.to(DT))


@_warps(4, 8, norm=False)
@triton.jit
def _state_fwd(
    k, v, cs, g_ptr, docs, S0, z0, st, ST, zT,
    sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d,
    N, H, D, DV, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr, FINAL: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    kb = k + _base(i_bh, H, sk_b, sk_h)
    vb = v + _base(i_bh, H, sv_b, sv_h) + (i_v * BV).to(tl.int64) * sv_d
    rk, cv = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    g = tl.load(g_ptr + i_bh % H) if HAS_G else 0.0
    sb = i_bh.to(tl.int64) * (D + ONE)  # (batch, head)'s S0, z0 in (D', d_v), (D',)
    b_h, b_z, b_h1, b_z1 = _get(S0 + sb * DV, z0 + sb, rk, cv, D, DV, ONE, COS)  # the initial state, or zeros
    for i_t in range(NT):
        t0 = i_t * BT
        hp, zp = _slot(st, i_bh, NT, i_t, D, DV, ONE)
        _put(hp, zp, b_h, b_z, b_h1, b_z1, rk, cv, D, DV, D * (i_v == 0), ONE, COS)
        x = _tile(kb, sk_n, sk_d, t0, N, D, BT, BK)
        _, kn, kd = _features(x, cs, t0, N, D, COS, ROPE, BT, BK)
        b_v = _tile(vb, sv_n, sv_d, t0, N, DV - i_v * BV, BT, BV)
        _, _, w, gL = _weights(t0, N, g, docs, i_bh, H, HAS_G, DOCS, BT)
        b_h = b_h * gL + _lp(tl.trans(kn * w[:, None]), b_v, DT, PREC)
        b_z = b_z * gL + tl.sum(kd * w[:, None], 0)
        if COS:
            b_h1 = b_h1 * gL + tl.sum(b_v * w[:, None], 0)
            b_z1 = b_z1 * gL + tl.sum(w, 0)
    if FINAL:
        _put(ST + sb * DV, zT + sb, b_h, b_z, b_h1, b_z1, rk, cv, D, DV, D * (i_v == 0), ONE, COS)


@_warps(4, 8)
@triton.jit
def _out_fwd(
    q, k, v, cs, g_ptr, docs, st, o, den,
    sq_b, sq_h, sq_n, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, so_b, so_h, so_n, so_d,
    N, H, D, DV, NT, eps,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr, NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    t0 = i_t * BT
    rk, cv, rt = tl.arange(0, BK), tl.arange(0, BV), t0 + tl.arange(0, BT)
    g = tl.load(g_ptr + i_bh % H) if HAS_G else 0.0
    xq = _tile(q + _base(i_bh, H, sq_b, sq_h), sq_n, sq_d, t0, N, D, BT, BK)
    xk = _tile(k + _base(i_bh, H, sk_b, sk_h), sk_n, sk_d, t0, N, D, BT, BK)
    b_v = _tile(v + _base(i_bh, H, sv_b, sv_h), sv_n, sv_d, t0, N, DV, BT, BV)
    _, qn, qd = _features(xq, cs, t0, N, D, COS, ROPE, BT, BK)
    _, kn, kd = _features(xk, cs, t0, N, D, COS, ROPE, BT, BK)
    M, eb, _, _ = _weights(t0, N, g, docs, i_bh, H, HAS_G, DOCS, BT)
    hp, zp = _slot(st, i_bh, NT, i_t, D, DV, ONE)
    hm = (rk < D)[:, None] & (cv < DV)[None, :]
    b_h = tl.load(hp + (ONE + rk)[:, None] * DV + cv[None, :], mask=hm, other=0.0)
    A = (_lp(qn, tl.trans(kn), DT, PREC) + ONE) * M
    num = _lp(A, b_v, DT, PREC) + eb[:, None] * _mm(qn, b_h, PREC)
    if COS:
        num += eb[:, None] * tl.load(hp + cv, mask=cv < DV, other=0.0)[None, :]
    if NORM:
        b_z = tl.load(zp + ONE + rk, mask=rk < D, other=0.0)
        if ROPE == 1:
            Ad = (_lp(qd, tl.trans(kd), DT, PREC) + ONE) * M
        else:
            Ad = A
        inter = tl.sum(qd * b_z[None, :], 1)
        if COS:
            inter += tl.load(zp)
        dn = tl.sum(Ad, 1) + eb * inter + eps
        if ROPE == 2:
            dn = tl.where(tl.abs(dn) < DEN_FLOOR, tl.where(dn < 0, -DEN_FLOOR, DEN_FLOOR), dn)
        num = num / dn[:, None]
        tl.store(den + i_bh.to(tl.int64) * N + rt, dn, mask=rt < N)
    ob = o + _base(i_bh, H, so_b, so_h)
    om = (rt < N)[:, None] & (cv < DV)[None, :]
    tl.store(ob + rt[:, None] * so_n + cv[None, :] * so_d, num.to(o.dtype.element_ty), mask=om)


@triton.jit
def _dden_rows(
    b_do, o, den, dd, so_b, so_h, so_n, so_d, t0, i_bh, N, H, DV,
    BT: tl.constexpr, BV: tl.constexpr, GUARD: tl.constexpr,
):  # fmt: skip
    """(∂L/∂den_i = -(do_i·o_i) / den_i, 0 where the guard clamped, also stored in dd; den_i) of the chunk at t0."""
    b_o = _tile(o + _base(i_bh, H, so_b, so_h), so_n, so_d, t0, N, DV, BT, BV)
    dn = _rows(den + i_bh.to(tl.int64) * N, t0, N, BT, 1.0)
    e = -tl.sum(b_do * b_o, 1) / dn
    if GUARD:
        e = tl.where(tl.abs(dn) > DEN_FLOOR, e, 0.0)
    rt = t0 + tl.arange(0, BT)
    tl.store(dd + i_bh.to(tl.int64) * N + rt, e, mask=rt < N)
    return e, dn


@triton.jit
def _dden(
    do, o, den, dd, sd_b, sd_h, sd_n, sd_d, so_b, so_h, so_n, so_d, N, H, DV,
    BT: tl.constexpr, BV: tl.constexpr, GUARD: tl.constexpr,
):  # fmt: skip
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    b_do = _tile(do + _base(i_bh, H, sd_b, sd_h), sd_n, sd_d, i_t * BT, N, DV, BT, BV)
    _dden_rows(b_do, o, den, dd, so_b, so_h, so_n, so_d, i_t * BT, i_bh, N, H, DV, BT, BV, GUARD)


@_warps(4, 8)
@triton.jit
def _state_bwd(
    q, cs, g_ptr, docs, do, den, dd, dST, dzT, dst, dS0, dz0,
    sq_b, sq_h, sq_n, sq_d, sd_b, sd_h, sd_n, sd_d,
    N, H, D, DV, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr, NORM: tl.constexpr, D0: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Slot c + 1 of dst: the gradient of the state after chunk c; dS0, dz0 (D0) that of the state before chunk 0."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    qb = q + _base(i_bh, H, sq_b, sq_h)
    dob = do + _base(i_bh, H, sd_b, sd_h) + (i_v * BV).to(tl.int64) * sd_d
    rk, cv = tl.arange(0, BK), i_v * BV + tl.arange(0, BV)
    g = tl.load(g_ptr + i_bh % H) if HAS_G else 0.0
    sb = i_bh.to(tl.int64) * (D + ONE)  # (batch, head)'s S0, z0 in (D', d_v), (D',)
    b_dh, b_dz, b_dh1, b_dz1 = _get(dST + sb * DV, dzT + sb, rk, cv, D, DV, ONE, COS)  # the final state's, or zeros
    for j in range(NT):
        i_t = NT - 1 - j
        t0 = i_t * BT
        hp, zp = _slot(dst, i_bh, NT, i_t + 1, D, DV, ONE)
        _put(hp, zp, b_dh, b_dz, b_dh1, b_dz1, rk, cv, D, DV, D * (i_v == 0), ONE, COS)
        x = _tile(qb, sq_n, sq_d, t0, N, D, BT, BK)
        _, qn, qd = _features(x, cs, t0, N, D, COS, ROPE, BT, BK)
        dN = _tile(dob, sd_n, sd_d, t0, N, DV - i_v * BV, BT, BV)
        _, eb, _, gL = _weights(t0, N, g, docs, i_bh, H, HAS_G, DOCS, BT)
        if NORM:
            dN = dN / _rows(den + i_bh.to(tl.int64) * N, t0, N, BT, 1.0)[:, None]
        b_dh = b_dh * gL + _lp(tl.trans(qn * eb[:, None]), dN, DT, PREC)
        b_dz = b_dz * gL
        b_dz1 = b_dz1 * gL
        if COS:
            b_dh1 = b_dh1 * gL + tl.sum(dN * eb[:, None], 0)
        if NORM:
            e = eb * _rows(dd + i_bh.to(tl.int64) * N, t0, N, BT, 0.0)
            b_dz += tl.sum(qd * e[:, None], 0)
            if COS:
                b_dz1 += tl.sum(e, 0)
    if D0:
        _put(dS0 + sb * DV, dz0 + sb, b_dh, b_dz, b_dh1, b_dz1, rk, cv, D, DV, D * (i_v == 0), ONE, COS)


@triton.jit
def _part(
    x, y, cs, g_ptr, docs, sx_b, sx_h, sx_n, sx_d, sy_b, sy_h, sy_n, sy_d, i_t, i_bh, N, H, D, DV,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr,
):  # fmt: skip
    """What one chunk's part of a state (or state gradient) is made of: (the numerator's and the denominator's
    features of x's tile, y's tile, the query weights exp(b_i), the key weights exp((L-1-j) g), exp(L g))."""
    t0 = i_t * BT
    g = tl.load(g_ptr + i_bh % H) if HAS_G else 0.0
    f = _tile(x + _base(i_bh, H, sx_b, sx_h), sx_n, sx_d, t0, N, D, BT, BK)
    _, fn, fd = _features(f, cs, t0, N, D, COS, ROPE, BT, BK)
    b_y = _tile(y + _base(i_bh, H, sy_b, sy_h), sy_n, sy_d, t0, N, DV, BT, BV)
    _, eb, w, gL = _weights(t0, N, g, docs, i_bh, H, HAS_G, DOCS, BT)
    return fn, fd, b_y, eb, w, gL


@_warps(4, 8, norm=False)
@triton.jit
def _chunk_state(
    k, v, cs, g_ptr, docs, st, gate,
    sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d,
    N, H, D, DV, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr, GATE: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Slot c + 1: chunk c's own part of the state after it, Σ_j exp((L-1-j) g) (kn_j v_jᵀ, kd_j); gate[c + 1] the
    decay exp(L g) of the state before it (GATE: a decay or documents; else it is 1 and not stored).  _scan sums."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    rk, cv = tl.arange(0, BK), tl.arange(0, BV)
    kn, kd, b_v, _, w, gL = _part(
        k, v, cs, g_ptr, docs, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, i_t, i_bh, N, H, D, DV,
        BT, BK, BV, COS, ROPE, HAS_G, DOCS,
    )  # fmt: skip
    hp, zp = _slot(st, i_bh, NT, i_t + 1, D, DV, ONE)
    dh, dz = _lp(tl.trans(kn * w[:, None]), b_v, DT, PREC), tl.sum(kd * w[:, None], 0)
    _put(hp, zp, dh, dz, tl.sum(b_v * w[:, None], 0), tl.sum(w, 0), rk, cv, D, DV, D, ONE, COS)
    if GATE:
        tl.store(gate + i_bh.to(tl.int64) * (NT + 1) + i_t + 1, gL)


@_warps(4, 8)
@triton.jit
def _chunk_dstate(
    q, cs, g_ptr, docs, do, o, den, dd, dst, gate,
    sq_b, sq_h, sq_n, sq_d, sd_b, sd_h, sd_n, sd_d, so_b, so_h, so_n, so_d,
    N, H, D, DV, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr, NORM: tl.constexpr, GUARD: tl.constexpr, GATE: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """With NORM ∂L/∂den_i = -(do_i·o_i) / den_i (0 where the guard clamped) into dd; slot c: chunk c's own part of
    the gradient of the state before it, Σ_i exp(b_i) (qn_i (do_i/den_i)ᵀ, qd_i ∂L/∂den_i); gate[c]: exp(L g).  _scan
    sums them in reverse."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    t0 = i_t * BT
    rk, cv = tl.arange(0, BK), tl.arange(0, BV)
    qn, qd, dN, eb, _, gL = _part(
        q, do, cs, g_ptr, docs, sq_b, sq_h, sq_n, sq_d, sd_b, sd_h, sd_n, sd_d, i_t, i_bh, N, H, D, DV,
        BT, BK, BV, COS, ROPE, HAS_G, DOCS,
    )  # fmt: skip
    hp, zp = _slot(dst, i_bh, NT, i_t, D, DV, ONE)
    if NORM:
        e, dn = _dden_rows(dN, o, den, dd, so_b, so_h, so_n, so_d, t0, i_bh, N, H, DV, BT, BV, GUARD)
        dN = dN / dn[:, None]
        e = e * eb
    else:  # z's gradient only decays (from the final state's), nothing joins it
        e = eb * 0.0
    dh, dz = _lp(tl.trans(qn * eb[:, None]), dN, DT, PREC), tl.sum(qd * e[:, None], 0)
    _put(hp, zp, dh, dz, tl.sum(dN * eb[:, None], 0), tl.sum(e, 0), rk, cv, D, DV, D, ONE, COS)
    if GATE:
        tl.store(gate + i_bh.to(tl.int64) * (NT + 1) + i_t, gL)


@triton.jit
def _lin(a1, x1, a2, x2):
    """Two steps s -> a s + x of a linear recurrence, the first then the second: _scan's operator."""
    return a1 * a2, x1 * a2 + x2


@triton.jit
def _scan(
    st, gate, A0, a0, A1, a1, NT, D, DV,
    COS: tl.constexpr, REVERSE: tl.constexpr, GATE: tl.constexpr, INIT: tl.constexpr, LAST: tl.constexpr,
    U: tl.constexpr, BW: tl.constexpr,
):  # fmt: skip
    """The slots of a state buffer in order, 1 … NT (REVERSE: NT - 1 … 0), in place: s_j = gate_j s_prev + slot_j
    (gate 1 without GATE), from s = (A0, a0) (INIT; else 0), which goes into the first slot (0, or NT); the last s
    also into (A1, a1) (LAST).  The recurrence is elementwise: each program takes BW of the W entries of every slot,
    U slots at a time (one (U, BW) load, then an associative scan down them)."""
    i_w, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    DF = D + ONE
    HW, W = DF * DV, DF * (DV + 1)
    c = i_w * BW + tl.arange(0, BW)
    cm, ch, cz, zc = c < W, c < HW, (c >= HW) & (c < W), tl.maximum(c - HW, 0)  # all, H's, z's, the index in z
    p = st + i_bh.to(tl.int64) * (NT + 1) * W
    gp = gate + i_bh.to(tl.int64) * (NT + 1)
    s = tl.zeros([BW], dtype=tl.float32)
    if INIT:
        s += tl.load(A0 + i_bh.to(tl.int64) * HW + c, mask=ch, other=0.0)
        s += tl.load(a0 + i_bh.to(tl.int64) * DF + zc, mask=cz, other=0.0)
    if REVERSE:
        tl.store(p + NT.to(tl.int64) * W + c, s, mask=cm)
    else:
        tl.store(p + c, s, mask=cm)
    u = tl.arange(0, U)
    for i in range(0, NT, U):
        j = i + 1 + u  # the steps, 1 … NT
        if REVERSE:
            r = NT - j
        else:
            r = j
        m = j <= NT
        mm = m[:, None] & cm[None, :]
        ptr = p + r[:, None].to(tl.int64) * W + c[None, :]
        x = tl.load(ptr, mask=mm, other=0.0)
        if GATE:
            a = tl.load(gp + r, mask=m, other=1.0)
            P, Y = tl.associative_scan((tl.broadcast_to(a[:, None], (U, BW)), x), 0, _lin)
            Y += P * s[None, :]
        else:
            Y = tl.cumsum(x, 0) + s[None, :]
        tl.store(ptr, Y, mask=mm)
        s = tl.sum(tl.where((u == U - 1)[:, None], Y, 0.0), 0)  # past NT the steps are (1, 0): Y's last row is s
    if LAST:
        tl.store(A1 + i_bh.to(tl.int64) * HW + c, s, mask=ch)
        tl.store(a1 + i_bh.to(tl.int64) * DF + zc, s, mask=cz)


@triton.jit
def _phi_bwd(gf, x, f, COS: tl.constexpr):
    """∂L/∂x from ∂L/∂f, f = φ(x) (features.phi_backward_)."""
    if COS:
        r = tl.sqrt(tl.sum(x * x, 1))
        fg = tl.where(r >= TINY, tl.sum(f * gf, 1), 0.0)
        return (gf - f * fg[:, None]) / tl.maximum(r, TINY)[:, None]
    return gf * tl.minimum(f, 1.0)


@_warps(8, 4)
@triton.jit
def _grad(
    q, k, v, cs, g_ptr, docs, st, do, den, dd, dst, dq, dk, dv,
    sq_b, sq_h, sq_n, sq_d, sk_b, sk_h, sk_n, sk_d, sv_b, sv_h, sv_n, sv_d, sd_b, sd_h, sd_n, sd_d,
    sdq_b, sdq_h, sdq_n, sdq_d, sdk_b, sdk_h, sdk_n, sdk_d, sdv_b, sdv_h, sdv_n, sdv_d,
    N, H, D, DV, NT,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, COS: tl.constexpr, ROPE: tl.constexpr,
    HAS_G: tl.constexpr, DOCS: tl.constexpr, NORM: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dv first (then the scores are dead), dq and dk after; q and k are loaded again for φ' (few tiles live)."""
    i_t, i_bh = tl.program_id(0), tl.program_id(1)
    ONE: tl.constexpr = 1 if COS else 0
    t0 = i_t * BT
    rk, cv, rt = tl.arange(0, BK), tl.arange(0, BV), t0 + tl.arange(0, BT)
    g = tl.load(g_ptr + i_bh % H) if HAS_G else 0.0
    qb, kb = q + _base(i_bh, H, sq_b, sq_h), k + _base(i_bh, H, sk_b, sk_h)
    _, qn, qd = _features(_tile(qb, sq_n, sq_d, t0, N, D, BT, BK), cs, t0, N, D, COS, ROPE, BT, BK)
    _, kn, kd = _features(_tile(kb, sk_n, sk_d, t0, N, D, BT, BK), cs, t0, N, D, COS, ROPE, BT, BK)
    dN = _tile(do + _base(i_bh, H, sd_b, sd_h), sd_n, sd_d, t0, N, DV, BT, BV)
    if NORM:
        dN = dN / _rows(den + i_bh.to(tl.int64) * N, t0, N, BT, 1.0)[:, None]
        dD = _rows(dd + i_bh.to(tl.int64) * N, t0, N, BT, 0.0)
    M, eb, w, _ = _weights(t0, N, g, docs, i_bh, H, HAS_G, DOCS, BT)
    hp, zp = _slot(st, i_bh, NT, i_t, D, DV, ONE)  # the state before the chunk
    dhp, dzp = _slot(dst, i_bh, NT, i_t + 1, D, DV, ONE)  # the gradient of the state after it
    hm = (rk < D)[:, None] & (cv < DV)[None, :]
    hoff = (ONE + rk)[:, None] * DV + cv[None, :]
    b_dh = tl.load(dhp + hoff, mask=hm, other=0.0)
    # dv = Aᵀ dN + w kn dH (+ w dH's constant row)
    A = (_lp(qn, tl.trans(kn), DT, PREC) + ONE) * M
    dvv = _lp(tl.trans(A), dN, DT, PREC) + w[:, None] * _mm(kn, b_dh, PREC)
    if COS:
        dvv += w[:, None] * tl.load(dhp + cv, mask=cv < DV, other=0.0)[None, :]
    mv = (rt < N)[:, None] & (cv < DV)[None, :]
    pv = dv + _base(i_bh, H, sdv_b, sdv_h) + rt[:, None] * sdv_n + cv[None, :] * sdv_d
    tl.store(pv, dvv.to(dv.dtype.element_ty), mask=mv)
    # dq, dk of the numerator's features (and of the denominator's where they are the same)
    b_v = _tile(v + _base(i_bh, H, sv_b, sv_h), sv_n, sv_d, t0, N, DV, BT, BV)
    dP = _lp(dN, tl.trans(b_v), DT, PREC)
    if NORM and ROPE != 1:  # shared features: the denominator is a value column of ones
        dP += dD[:, None]
    dP = dP * M
    b_h = tl.load(hp + hoff, mask=hm, other=0.0)
    dqn = _lp(dP, kn, DT, PREC) + eb[:, None] * _mm(dN, tl.trans(b_h), PREC)
    dkn = _lp(tl.trans(dP), qn, DT, PREC) + w[:, None] * _mm(b_v, tl.trans(b_dh), PREC)
    b_z = tl.load(zp + ONE + rk, mask=rk < D, other=0.0)
    b_dz = tl.load(dzp + ONE + rk, mask=rk < D, other=0.0)
    if ROPE == 1:  # the denominator's own, unrotated features
        dkd = w[:, None] * b_dz[None, :]
        if NORM:
            dqd = dD[:, None] * (_lp(M, kd, DT, PREC) + eb[:, None] * b_z[None, :])
            dkd += _lp(tl.trans(M), qd * dD[:, None], DT, PREC)
    else:
        dkn += w[:, None] * b_dz[None, :]
        if NORM:
            dqn += (eb * dD)[:, None] * b_z[None, :]
    if ROPE != 0:  # back through the rotation: the inverse turn
        cos, sin = _table(cs, t0, N, D, BT, BK)
        dqn = _rotate(dqn, cos, -sin, BT, BK)
        dkn = _rotate(dkn, cos, -sin, BT, BK)
    if ROPE == 1:
        dkn += dkd
        if NORM:
            dqn += dqd
    # back through φ, from q and k loaded again
    xq = _tile(qb, sq_n, sq_d, t0, N, D, BT, BK)
    xk = _tile(kb, sk_n, sk_d, t0, N, D, BT, BK)
    gq = _phi_bwd(dqn, xq, _phi(xq, t0, N, D, COS, BT, BK), COS)
    gk = _phi_bwd(dkn, xk, _phi(xk, t0, N, D, COS, BT, BK), COS)
    m = (rt < N)[:, None] & (rk < D)[None, :]
    pq = dq + _base(i_bh, H, sdq_b, sdq_h) + rt[:, None] * sdq_n + rk[None, :] * sdq_d
    pk = dk + _base(i_bh, H, sdk_b, sdk_h) + rt[:, None] * sdk_n + rk[None, :] * sdk_d
    tl.store(pq, gq.to(dq.dtype.element_ty), mask=m)
    tl.store(pk, gk.to(dk.dtype.element_ty), mask=m)
