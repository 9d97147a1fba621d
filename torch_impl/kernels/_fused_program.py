"""The Triton programs of the ``"triton"`` kernel (``fused.py`` says what they compute); imported with Triton only.

Three programs: ``forward`` (queries ``pid_m * BM ..`` of one (batch, head), every key block in turn; it writes
the output and each row's maximum and 1 / denominator), ``backward_dq`` (the same grid: dq, the tables'
gradients per program, the distance bias's and the bias input's gradients) and ``backward_dkdv`` (keys
``pid_n * BN ..`` of one (batch, key/value head), every query block of its query heads in turn: dk, dv).
Strides are in elements; a broadcast axis of the mask or bias has stride 0. Rows and columns past Lq, Lk, d,
dv or R are padded to the powers of two BM, BN, DP, DVP, RP and masked out. ``OFF`` holds each batch's
first query and key positions (q0, k0) (POS-1 with runs of consecutive positions: query i is at q0 + i, key j at
k0 + j, delta = j - i + off with off = k0 - q0), stride 0 when shared.
Every product is an IEEE one (``input_precision="ieee"``: no TF32 rounding of float32 inputs). Axis legend
(AXES-1).
"""

import triton
import triton.language as tl


@triton.jit
def _scores(q, kb, qr, DB, A, BIAS, b, h, offs_m, offs_n, row_ok, col_ok, q0, off, nd_lo, ND,
            sdb, sab, sah, sam, san, sbb, sbh, sbm, sbn, scale,
            KMAX: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BIASED: tl.constexpr,
            KEYS: tl.constexpr, DIST: tl.constexpr, WH: tl.constexpr, WW: tl.constexpr,
            PREFIX: tl.constexpr):  # fmt: skip
    """(s, ok, delta): the logits of a (BM, BN) block in the stat dtype (PREC-4), -inf where the key is not
    allowed; whether it is; the pairs' distances."""
    stat = tl.float64 if q.dtype == tl.float64 else tl.float32
    s = tl.dot(q, tl.trans(kb), input_precision="ieee").to(stat) * scale  # SCALE-2
    delta = offs_n[None, :] - offs_m[:, None] + off  # POS-2
    ok = row_ok[:, None] & col_ok[None, :]
    if KEYS:  # SHAW-2, SHAW-3: the row of the clipped distance, s_rel folded into qr
        s += tl.gather(qr, tl.minimum(tl.maximum(delta, -KMAX), KMAX) + KMAX, axis=1)
    if DIST == 1:  # REL-3 (3): a scheme bias of delta alone (ALiBi, T5), read per distance, unscaled (SCALE-4)
        at = delta - nd_lo
        s += tl.load(DB + h * sdb + at, mask=ok & (at >= 0) & (at < ND), other=0.0).to(stat)
    if DIST == 2:  # SWIN-1: the table row of both positions, unscaled (SCALE-4)
        at = _pair_rows(offs_m + q0, offs_n + q0 + off, WH, WW, PREFIX)
        s += tl.load(DB + h * sdb + at, mask=ok, other=0.0).to(stat)
    if BIASED:  # BIAS-1: added unscaled
        s += tl.load(BIAS + b * sbb + h * sbh + offs_m[:, None] * sbm + offs_n[None, :] * sbn, mask=ok, other=0.0).to(
            stat
        )
    if CAUSAL:  # CAUSAL-1 through positions
        ok = ok & (delta <= 0)
    if MASKED:  # MASK-4: the mask, -inf in the bias, the window
        allowed = tl.load(A + b * sab + h * sah + offs_m[:, None] * sam + offs_n[None, :] * san, mask=ok, other=0)
        ok = ok & (allowed != 0)
    return tl.where(ok, s, float("-inf")), ok, delta


@triton.jit
def _pair_rows(q_pos, k_pos, WH: tl.constexpr, WW: tl.constexpr, PREFIX: tl.constexpr):
    """SWIN-3, SWIN-4: the (BM, BN) table rows of queries at q_pos (BM,) and keys at k_pos (BN,). Window
    coordinates by floor division (POS-5), whatever the sign convention of the integer remainder."""
    qp = q_pos - PREFIX
    kp = k_pos - PREFIX
    qw = qp % WW
    qw = tl.where(qw < 0, qw + WW, qw)
    kw = kp % WW
    kw = tl.where(kw < 0, kw + WW, kw)
    dh = (kp - kw)[None, :] // WW - (qp - qw)[:, None] // WW  # exact divisions
    dh = tl.minimum(tl.maximum(dh, 1 - WH), WH - 1)
    dw = tl.minimum(tl.maximum(kw[None, :] - qw[:, None], 1 - WW), WW - 1)
    rows = (dh + (WH - 1)) * (2 * WW - 1) + (dw + (WW - 1))
    if PREFIX > 0:  # a pair with a prefix token: +0 query prefix, +1 key prefix, +2 both
        q_pre = (q_pos < PREFIX)[:, None]
        k_pre = (k_pos < PREFIX)[None, :]
        base = (2 * WH - 1) * (2 * WW - 1)
        special = base + tl.where(q_pre & k_pre, 2, tl.where(k_pre, 1, 0))
        rows = tl.where(q_pre | k_pre, special, rows)
    return rows


@triton.jit
def _tile(P, base, offs, ok, stride, offs_c, C):
    """The tile P[base + offs * stride + c] of rows offs (those not ok and columns c >= C read 0)."""
    return tl.load(P + base + offs[:, None] * stride + offs_c[None, :], mask=ok[:, None] & (offs_c[None, :] < C),
                   other=0.0)  # fmt: skip


@triton.jit
def _softmax_grad(s, ok, delta, do, vb, dor, ROW_MAX, ROW_INV, DELTA, at, row_ok, KMAX: tl.constexpr,
                  VALUES: tl.constexpr):  # fmt: skip
    """(p, ds): the forward's weights of the block, recomputed from the rows' maximum and 1 / denominator at
    ``at``, and the softmax's backward ds = p (dP - do . out), dP with the value term's do . rel_v[idx]."""
    stat = s.dtype
    row_max = tl.load(ROW_MAX + at, mask=row_ok, other=0.0)
    row_inv = tl.load(ROW_INV + at, mask=row_ok, other=0.0)
    dsum = tl.load(DELTA + at, mask=row_ok, other=0.0)  # do_i . out_i
    p = tl.where(ok, tl.exp(s - row_max[:, None]) * row_inv[:, None], 0.0)
    dp = tl.dot(do, tl.trans(vb), input_precision="ieee").to(stat)
    if VALUES:  # SHAW-4: d p[i, j] gains do_i . rel_v[idx]
        dp += tl.gather(dor, tl.minimum(tl.maximum(delta, -KMAX), KMAX) + KMAX, axis=1)
    return p, p * (dp - dsum[:, None])


@triton.jit
def _per_row(x, delta, offs_m, offs_r, start_n, off, KMAX: tl.constexpr, BN: tl.constexpr):
    """(BM, RP): the block's x (0 off the allowed pairs) summed per clipped table row (SHAW-2): interior row r
    holds the one key j = i + r - k - off, a gather; rows 0 and 2k the keys at -k and beyond, k and beyond."""
    col = offs_m[:, None] + offs_r[None, :] - KMAX - off - start_n
    interior = (offs_r[None, :] >= 1) & (offs_r[None, :] <= 2 * KMAX - 1) & (col >= 0) & (col < BN)
    rows = tl.where(interior, tl.gather(x, tl.minimum(tl.maximum(col, 0), BN - 1), axis=1), 0.0)
    left = tl.sum(tl.where(delta <= -KMAX, x, 0.0), 1)
    right = tl.sum(tl.where((delta > -KMAX) & (delta >= KMAX), x, 0.0), 1)  # k = 0: one row, once
    rows += tl.where(offs_r[None, :] == 0, left[:, None], 0.0)
    rows += tl.where(offs_r[None, :] == 2 * KMAX, right[:, None], 0.0)
    return rows


@triton.jit
def _table(T, h, st, offs_r, offs_c, R, C):
    """The (RP, CP) table of head h (stride 0 when shared), 0 past R rows and C columns."""
    at = T + h * st + offs_r[:, None] * C + offs_c[None, :]
    return tl.load(at, mask=(offs_r[:, None] < R) & (offs_c[None, :] < C), other=0.0)


def forward(
    Q, K, V, RK, RV, DB, OFF, A, BIAS, OUT, OUT_STAT, ROW_MAX, ROW_INV,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, srk, srv, sdb, soff,
    sab, sah, sam, san, sbb, sbh, sbm, sbn, sob, soh, som,
    H, Lq, Lk, D, DV, R, nd_lo, ND, scale, rel_scale,
    KMAX: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BIASED: tl.constexpr,
    KEYS: tl.constexpr, VALUES: tl.constexpr, DIST: tl.constexpr, WH: tl.constexpr, WW: tl.constexpr,
    PREFIX: tl.constexpr, GROUP: tl.constexpr, KEEP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, RP: tl.constexpr,
):  # fmt: skip
    """The output; each row's maximum logit and 1 / denominator for the backward (its weights exactly the
    forward's: exp(s - m) / l, no log-sum-exp rounded at the logits' magnitude); with KEEP the output in the stat
    dtype too (16-bit inputs: the backward's dout . out from the unrounded output)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP  # HEAD-3: query head h reads key/value head h // G
    q0 = tl.load(OFF + b * soff)
    off = tl.load(OFF + b * soff + 1) - q0
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, DP)
    offs_dv = tl.arange(0, DVP)
    offs_r = tl.arange(0, RP)
    row_ok = offs_m < Lq
    q = _tile(Q, b * sqb + h * sqh, offs_m, row_ok, sqm, offs_d, D)
    stat = tl.float64 if q.dtype == tl.float64 else tl.float32  # PREC-4
    qr = tl.zeros((BM, RP), stat)
    if KEYS:  # SHAW-3: the table logits of the block's queries, s_rel folded in (SCALE-3)
        qr = tl.dot(q, tl.trans(_table(RK, h, srk, offs_r, offs_d, R, D)), input_precision="ieee").to(stat) * rel_scale
    m_i = tl.full((BM,), float("-inf"), stat)
    l_i = tl.zeros((BM,), stat)
    acc = tl.zeros((BM, DVP), stat)
    rows = tl.zeros((BM, RP), stat)  # SHAW-4: the weights summed per table row, unnormalised like acc
    hi = Lk
    if CAUSAL:  # CAUSAL-1: no key after the block's last query, key j <= i - off
        hi = tl.maximum(tl.minimum(Lk, (pid_m + 1) * BM - off), 0)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        col_ok = offs_n < Lk
        kb = _tile(K, b * skb + hk * skh, offs_n, col_ok, skn, offs_d, D)
        s, ok, delta = _scores(
            q, kb, qr, DB, A, BIAS, b, h, offs_m, offs_n, row_ok, col_ok, q0, off, nd_lo, ND,
            sdb, sab, sah, sam, san, sbb, sbh, sbm, sbn, scale, KMAX, CAUSAL, MASKED, BIASED, KEYS, DIST, WH, WW,
            PREFIX,
        )  # fmt: skip
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no allowed key yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.where(ok, tl.exp(s - m_safe[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = _tile(V, b * svb + hk * svh, offs_n, col_ok, svn, offs_dv, DV)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision="ieee").to(stat)
        if VALUES:
            rows = rows * alpha[:, None] + _per_row(p, delta, offs_m, offs_r, start_n, off, KMAX, BN)
        m_i = m_new
    l_safe = tl.where(l_i == 0, 1.0, l_i)  # MASK-5: a row with no allowed key: acc and rows are 0
    out = acc / l_safe[:, None]
    if VALUES:
        rv = _table(RV, h, srv, offs_r, offs_dv, R, DV)
        out += tl.dot(rows / l_safe[:, None], rv.to(stat), input_precision="ieee")
    tl.store(
        OUT + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :],
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < DV),
    )
    if KEEP:
        tl.store(
            OUT_STAT + (bh * Lq + offs_m[:, None]) * DV + offs_dv[None, :],
            out,
            mask=row_ok[:, None] & (offs_dv[None, :] < DV),
        )
    tl.store(ROW_MAX + bh * Lq + offs_m, tl.where(l_i == 0, 0.0, m_i), mask=row_ok)
    tl.store(ROW_INV + bh * Lq + offs_m, tl.where(l_i == 0, 0.0, 1.0 / l_safe), mask=row_ok)  # MASK-5: p = 0


def backward_dq(
    Q, K, V, RK, RV, DB, OFF, A, BIAS, DO, ROW_MAX, ROW_INV, DELTA, DQ, DRK, DRV, DDB, DBIAS,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, srk, srv, sdb, soff,
    sab, sah, sam, san, sbb, sbh, sbm, sbn, sdob, sdoh, sdom, sgb, sgh, sgm, sgn,
    H, Lq, Lk, D, DV, R, nd_lo, ND, scale, rel_scale,
    KMAX: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BIASED: tl.constexpr,
    KEYS: tl.constexpr, VALUES: tl.constexpr, DIST: tl.constexpr, WH: tl.constexpr, WW: tl.constexpr,
    PREFIX: tl.constexpr, DIST_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr, GROUP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, RP: tl.constexpr, TP: tl.constexpr,
):  # fmt: skip
    """dq of the block's queries; the tables' gradients of its queries into DRK, DRV at (b, h, pid_m) (summed
    on the host: no atomics); the scheme bias's into DDB (atomic adds: of the block's diagonal sums per distance,
    of each pair's ds at its Swin row); the bias input's into DBIAS, laid out as the bias (stride 0 on its
    broadcast axes, atomic adds)."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    q0 = tl.load(OFF + b * soff)
    off = tl.load(OFF + b * soff + 1) - q0
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, DP)
    offs_dv = tl.arange(0, DVP)
    offs_r = tl.arange(0, RP)
    row_ok = offs_m < Lq
    q = _tile(Q, b * sqb + h * sqh, offs_m, row_ok, sqm, offs_d, D)
    do = _tile(DO, b * sdob + h * sdoh, offs_m, row_ok, sdom, offs_dv, DV)
    stat = tl.float64 if q.dtype == tl.float64 else tl.float32
    qr = tl.zeros((BM, RP), stat)
    dor = tl.zeros((BM, RP), stat)
    if KEYS:
        rk = _table(RK, h, srk, offs_r, offs_d, R, D)
        qr = tl.dot(q, tl.trans(rk), input_precision="ieee").to(stat) * rel_scale
    if VALUES:
        dor = tl.dot(do, tl.trans(_table(RV, h, srv, offs_r, offs_dv, R, DV)), input_precision="ieee").to(stat)
    dq = tl.zeros((BM, DP), stat)
    rows_ds = tl.zeros((BM, RP), stat)
    rows_p = tl.zeros((BM, RP), stat)
    hi = Lk
    if CAUSAL:
        hi = tl.maximum(tl.minimum(Lk, (pid_m + 1) * BM - off), 0)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        col_ok = offs_n < Lk
        kb = _tile(K, b * skb + hk * skh, offs_n, col_ok, skn, offs_d, D)
        vb = _tile(V, b * svb + hk * svh, offs_n, col_ok, svn, offs_dv, DV)
        s, ok, delta = _scores(
            q, kb, qr, DB, A, BIAS, b, h, offs_m, offs_n, row_ok, col_ok, q0, off, nd_lo, ND,
            sdb, sab, sah, sam, san, sbb, sbh, sbm, sbn, scale, KMAX, CAUSAL, MASKED, BIASED, KEYS, DIST, WH, WW,
            PREFIX,
        )  # fmt: skip
        p, ds = _softmax_grad(
            s, ok, delta, do, vb, dor, ROW_MAX, ROW_INV, DELTA, bh * Lq + offs_m, row_ok, KMAX, VALUES
        )
        dq += tl.dot(ds.to(kb.dtype), kb, input_precision="ieee").to(stat)
        if KEYS:
            rows_ds += _per_row(ds, delta, offs_m, offs_r, start_n, off, KMAX, BN)
        if VALUES:
            rows_p += _per_row(p, delta, offs_m, offs_r, start_n, off, KMAX, BN)
        if BIAS_GRAD:  # BIAS-1: d bias[i, j] = ds[i, j], summed over the bias's broadcast axes
            at = DBIAS + b * sgb + h * sgh + offs_m[:, None] * sgm + offs_n[None, :] * sgn
            tl.atomic_add(at, ds, mask=ok)
        if DIST_GRAD and DIST == 1:  # the block's ds summed along each diagonal t = j - i + BM - 1, at its distance
            t = tl.arange(0, TP)
            col = t[None, :] - (BM - 1) + tl.arange(0, BM)[:, None]
            diag = tl.sum(
                tl.where((col >= 0) & (col < BN), tl.gather(ds, tl.minimum(tl.maximum(col, 0), BN - 1), axis=1), 0.0),
                0,
            )
            at = start_n - pid_m * BM - (BM - 1) + off + t - nd_lo
            tl.atomic_add(DDB + h * ND + at, diag, mask=(t < BM + BN - 1) & (at >= 0) & (at < ND))
        if DIST_GRAD and DIST == 2:  # SWIN-1: each pair's ds added at its table row
            at = _pair_rows(offs_m + q0, offs_n + q0 + off, WH, WW, PREFIX)
            tl.atomic_add(DDB + h * ND + at, ds, mask=ok)
    dq = dq * scale
    part = (b * H + h) * tl.num_programs(0) + pid_m
    if KEYS:  # SHAW-3: d q_i += s_rel sum_r rows_ds[i, r] rel_k[r]; d rel_k[r] = s_rel sum_i rows_ds[i, r] q_i
        dq += tl.dot(rows_ds, rk.to(stat), input_precision="ieee") * rel_scale
        drk = tl.dot(tl.trans(rows_ds), q.to(stat), input_precision="ieee") * rel_scale
        tl.store(DRK + part * R * D + offs_r[:, None] * D + offs_d[None, :], drk,
                 mask=(offs_r[:, None] < R) & (offs_d[None, :] < D))  # fmt: skip
    if VALUES:  # SHAW-4: d rel_v[r] = sum_i rows_p[i, r] do_i
        drv = tl.dot(tl.trans(rows_p), do.to(stat), input_precision="ieee")
        tl.store(DRV + part * R * DV + offs_r[:, None] * DV + offs_dv[None, :], drv,
                 mask=(offs_r[:, None] < R) & (offs_dv[None, :] < DV))  # fmt: skip
    tl.store(
        DQ + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=row_ok[:, None] & (offs_d[None, :] < D),
    )


def backward_dkdv(
    Q, K, V, RK, RV, DB, OFF, A, BIAS, DO, ROW_MAX, ROW_INV, DELTA, DK, DV_,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, srk, srv, sdb, soff,
    sab, sah, sam, san, sbb, sbh, sbm, sbn, sdob, sdoh, sdom,
    H, Lq, Lk, D, DV, R, nd_lo, ND, scale, rel_scale,
    KMAX: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BIASED: tl.constexpr,
    KEYS: tl.constexpr, VALUES: tl.constexpr, DIST: tl.constexpr, WH: tl.constexpr, WW: tl.constexpr,
    PREFIX: tl.constexpr, GROUP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, RP: tl.constexpr,
):  # fmt: skip
    """dk, dv of the block's keys of key/value head hk, summed over its G query heads (HEAD-3). DK and DV_
    are contiguous (B, Hkv, Lk, d) and (B, Hkv, Lk, dv)."""
    pid_n = tl.program_id(0)
    bhk = tl.program_id(1)
    Hkv = H // GROUP
    b = bhk // Hkv
    hk = bhk % Hkv
    q0 = tl.load(OFF + b * soff)
    off = tl.load(OFF + b * soff + 1) - q0
    start_n = pid_n * BN
    offs_n = start_n + tl.arange(0, BN)
    offs_d = tl.arange(0, DP)
    offs_dv = tl.arange(0, DVP)
    offs_r = tl.arange(0, RP)
    col_ok = offs_n < Lk
    kb = _tile(K, b * skb + hk * skh, offs_n, col_ok, skn, offs_d, D)
    vb = _tile(V, b * svb + hk * svh, offs_n, col_ok, svn, offs_dv, DV)
    stat = tl.float64 if kb.dtype == tl.float64 else tl.float32
    dk = tl.zeros((BN, DP), stat)
    dv = tl.zeros((BN, DVP), stat)
    lo = 0
    if CAUSAL:  # CAUSAL-1: no query before start_n + off sees these keys
        lo = tl.maximum(start_n + off, 0) // BM * BM
    for g in range(GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        qr = tl.zeros((BM, RP), stat)
        dor = tl.zeros((BM, RP), stat)
        rk = _table(RK, h, srk, offs_r, offs_d, R, D)  # the head's tables, read once per head
        rv = _table(RV, h, srv, offs_r, offs_dv, R, DV)
        for start_m in range(lo, Lq, BM):
            offs_m = start_m + tl.arange(0, BM)
            row_ok = offs_m < Lq
            q = _tile(Q, b * sqb + h * sqh, offs_m, row_ok, sqm, offs_d, D)
            do = _tile(DO, b * sdob + h * sdoh, offs_m, row_ok, sdom, offs_dv, DV)
            if KEYS:
                qr = tl.dot(q, tl.trans(rk), input_precision="ieee").to(stat) * rel_scale
            if VALUES:
                dor = tl.dot(do, tl.trans(rv), input_precision="ieee").to(stat)
            s, ok, delta = _scores(
                q, kb, qr, DB, A, BIAS, b, h, offs_m, offs_n, row_ok, col_ok, q0, off, nd_lo, ND,
                sdb, sab, sah, sam, san, sbb, sbh, sbm, sbn, scale, KMAX, CAUSAL, MASKED, BIASED, KEYS, DIST, WH, WW,
                PREFIX,
            )  # fmt: skip
            p, ds = _softmax_grad(
                s, ok, delta, do, vb, dor, ROW_MAX, ROW_INV, DELTA, bh * Lq + offs_m, row_ok, KMAX, VALUES
            )
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision="ieee").to(stat)
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision="ieee").to(stat)
    row = b * Hkv + hk
    tl.store(DK + (row * Lk + offs_n[:, None]) * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < D))  # fmt: skip
    tl.store(DV_ + (row * Lk + offs_n[:, None]) * DV + offs_dv[None, :], dv.to(DV_.dtype.element_ty),
             mask=col_ok[:, None] & (offs_dv[None, :] < DV))  # fmt: skip
