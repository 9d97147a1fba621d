"""The Triton program of the ``"triton"`` kernel (``fused.py`` says what it computes); imported with Triton only.

One program: queries ``pid_m * BM ..`` of one (batch, head), every key block in turn. Strides are in
elements; a broadcast axis of the mask or bias has stride 0. Rows and columns past Lq, Lk, d, dv or R are
padded to the powers of two BM, BN, DP, DVP, RP and masked out. Axis legend (AXES-1).
"""

import triton.language as tl


def shaw_forward(
    Q, K, V, RK, RV, A, BIAS, OUT,
    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, srk, srv,
    sab, sah, sam, san, sbb, sbh, sbm, sbn, sob, soh, som,
    H, Lq, Lk, D, DV, R, scale, rel_scale,
    KMAX: tl.constexpr, CAUSAL: tl.constexpr, MASKED: tl.constexpr, BIASED: tl.constexpr,
    KEYS: tl.constexpr, VALUES: tl.constexpr, GROUP: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, DP: tl.constexpr, DVP: tl.constexpr, RP: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP  # HEAD-3: query head h reads key/value head h // G
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, DP)
    offs_dv = tl.arange(0, DVP)
    offs_r = tl.arange(0, RP)
    row_ok = offs_m < Lq
    q = tl.load(
        Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :],
        mask=row_ok[:, None] & (offs_d[None, :] < D),
        other=0.0,
    )
    stat = tl.float64 if q.dtype == tl.float64 else tl.float32  # PREC-4
    if KEYS:  # SHAW-3: the table logits of the block's queries, s_rel folded in (SCALE-3)
        rk = tl.load(
            RK + h * srk + offs_r[:, None] * D + offs_d[None, :],
            mask=(offs_r[:, None] < R) & (offs_d[None, :] < D),
            other=0.0,
        )
        qr = tl.dot(q, tl.trans(rk)).to(stat) * rel_scale
    m_i = tl.full((BM,), float("-inf"), stat)
    l_i = tl.zeros((BM,), stat)
    acc = tl.zeros((BM, DVP), stat)
    rows = tl.zeros((BM, RP), stat)  # SHAW-4: the weights summed per table row, unnormalised like acc
    hi = Lk
    if CAUSAL:  # CAUSAL-1 at default positions: no key after the block's last query
        hi = tl.minimum(Lk, (pid_m + 1) * BM)
    for start_n in range(0, hi, BN):
        offs_n = start_n + tl.arange(0, BN)
        col_ok = offs_n < Lk
        kb = tl.load(
            K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :],
            mask=col_ok[:, None] & (offs_d[None, :] < D),
            other=0.0,
        )
        s = tl.dot(q, tl.trans(kb)).to(stat) * scale  # SCALE-2
        delta = offs_n[None, :] - offs_m[:, None]  # POS-2 at default positions
        if KEYS:
            s += tl.gather(qr, tl.minimum(tl.maximum(delta, -KMAX), KMAX) + KMAX, axis=1)  # SHAW-2, SHAW-3
        ok = col_ok[None, :] & row_ok[:, None]
        if BIASED:  # BIAS-1: added unscaled
            s += tl.load(
                BIAS + b * sbb + h * sbh + offs_m[:, None] * sbm + offs_n[None, :] * sbn,
                mask=ok,
                other=0.0,
            ).to(stat)
        if CAUSAL:
            ok = ok & (delta <= 0)
        if MASKED:  # MASK-4: the mask, -inf in the bias, the window
            allowed = tl.load(A + b * sab + h * sah + offs_m[:, None] * sam + offs_n[None, :] * san, mask=ok, other=0)
            ok = ok & (allowed != 0)
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no allowed key yet
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vb = tl.load(
            V + b * svb + hk * svh + offs_n[:, None] * svn + offs_dv[None, :],
            mask=col_ok[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb).to(stat)
        if VALUES:  # interior row r holds the key j = i + r - k; rows 0 and 2k the clipped ones
            col = offs_m[:, None] + offs_r[None, :] - KMAX - start_n
            interior = (offs_r[None, :] >= 1) & (offs_r[None, :] <= 2 * KMAX - 1) & (col >= 0) & (col < BN)
            add = tl.where(interior, tl.gather(p, tl.minimum(tl.maximum(col, 0), BN - 1), axis=1), 0.0)
            left = tl.sum(tl.where(delta <= -KMAX, p, 0.0), 1)
            right = tl.sum(tl.where((delta > -KMAX) & (delta >= KMAX), p, 0.0), 1)  # k = 0: one row, once
            add += tl.where(offs_r[None, :] == 0, left[:, None], 0.0)
            add += tl.where(offs_r[None, :] == 2 * KMAX, right[:, None], 0.0)
            rows = rows * alpha[:, None] + add
        m_i = m_new
    l_safe = tl.where(l_i == 0, 1.0, l_i)  # MASK-5: a row with no allowed key: acc and rows are 0
    out = acc / l_safe[:, None]
    if VALUES:
        rv = tl.load(
            RV + h * srv + offs_r[:, None] * DV + offs_dv[None, :],
            mask=(offs_r[:, None] < R) & (offs_dv[None, :] < DV),
            other=0.0,
        )
        out += tl.dot(rows / l_safe[:, None], rv.to(stat))
    tl.store(
        OUT + b * sob + h * soh + offs_m[:, None] * som + offs_dv[None, :],
        out.to(OUT.dtype.element_ty),
        mask=row_ok[:, None] & (offs_dv[None, :] < DV),
    )
