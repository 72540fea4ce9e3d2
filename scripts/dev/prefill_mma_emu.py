"""A lane-level emulation of kernels/csrc/prefill_mma.cuh (its f16 path) on the CPU, for checking
the kernel's index math and control flow without a GPU: the TileCopier's swizzled stages,
ldmatrix (x4, plain and transposed) and mma.m16n8k16 by the PTX ISA's fragment layouts, and the
kernel's tile loop, masks, online softmax and writes, transcribed line by line. It mirrors the
kernel; change both together. Compares against float64 attention:

    python3 scripts/dev/prefill_mma_emu.py      (needs numpy; a few seconds)

Expect relative errors ~1e-4 (f16 inputs and probabilities); an index slip gives 1e-2 or more.
"""
import numpy as np

ROWS = 64  # kPrefillRows
WARPS = 4


def swz_index(r, d, D):
    chunk, within = d // 8, d % 8
    return r * D + ((chunk ^ (r & 7)) * 8) + within


def copy_tile(kc, vc, table, begin, end, t, bs, kvh, D):
    """TileCopier::issue for tile t: K and V rows (swizzled), zero past end."""
    stage_k = np.zeros(ROWS * D, np.float16)
    stage_v = np.zeros(ROWS * D, np.float16)
    for r in range(ROWS):
        p = begin + t * ROWS + r
        if p >= end:
            continue
        slot = table[p // bs] * bs + p % bs
        for d in range(D):
            stage_k[swz_index(r, d, D)] = kc[slot, kvh, d]
            stage_v[swz_index(r, d, D)] = vc[slot, kvh, d]
    return stage_k, stage_v


def ldmatrix_x4(smem, addrs, trans):
    """addrs[lane] = element offset of row (lane % 8) of matrix (lane // 8). Returns regs[lane][4][2]."""
    mats = [np.array([smem[addrs[m * 8 + r]: addrs[m * 8 + r] + 8] for r in range(8)]) for m in range(4)]
    regs = np.zeros((32, 4, 2), np.float16)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for i in range(4):
            M = mats[i].T if trans else mats[i]
            regs[lane, i] = M[g, 2 * c: 2 * c + 2]
    return regs


def mma(cfrag, afrag, b0, b1):
    """cfrag[lane][4] f32, afrag[lane][4][2], b0/b1[lane][2]: D = A B + C for m16n8k16."""
    A = np.zeros((16, 16), np.float32)
    B = np.zeros((16, 8), np.float32)
    C = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        A[g, 2 * c: 2 * c + 2] = afrag[lane, 0]
        A[g + 8, 2 * c: 2 * c + 2] = afrag[lane, 1]
        A[g, 2 * c + 8: 2 * c + 10] = afrag[lane, 2]
        A[g + 8, 2 * c + 8: 2 * c + 10] = afrag[lane, 3]
        B[2 * c: 2 * c + 2, g] = b0[lane]
        B[2 * c + 8: 2 * c + 10, g] = b1[lane]
        C[g, 2 * c: 2 * c + 2] = cfrag[lane, 0:2]
        C[g + 8, 2 * c: 2 * c + 2] = cfrag[lane, 2:4]
    Dm = A.astype(np.float64) @ B.astype(np.float64) + C
    out = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        out[lane, 0:2] = Dm[g, 2 * c: 2 * c + 2]
        out[lane, 2:4] = Dm[g + 8, 2 * c: 2 * c + 2]
    return out


def block(out, q, kc, vc, table, qs, qlen, ctx, head, kv_head, tile0, nheads, bs, D, scale):
    first_pos = ctx - qlen
    end = first_pos + min(qlen, tile0 + ROWS)
    tiles = (end + ROWS - 1) // ROWS
    stages = [copy_tile(kc, vc, table, 0, end, t, bs, kv_head, D) for t in range(tiles)]
    for warp in range(WARPS):
        row_a = np.array([tile0 + warp * 16 + lane // 4 for lane in range(32)])
        row_b = row_a + 8
        pos_a, pos_b = first_pos + row_a, first_pos + row_b
        warp_first = first_pos + tile0 + warp * 16
        idle = tile0 + warp * 16 >= qlen
        # load_query (head dims up to 128), or stage_query + ldmatrix a k-step at a time (256)
        qa = np.zeros((D // 16, 32, 4, 2), np.float16)
        lanes = np.arange(32)
        sub, row8 = lanes // 8, lanes % 8
        if D > 128:
            q_tile = np.zeros(ROWS * D, np.float16)
            for r in range(min(ROWS, qlen - tile0)):
                for d in range(D):
                    q_tile[swz_index(r, d, D)] = q[qs + tile0 + r, head, d]
            qrow = warp * 16 + (sub & 1) * 8 + row8
            for k in range(D // 16):
                qa[k] = ldmatrix_x4(q_tile, qrow * D + (((2 * k + (sub >> 1)) ^ (qrow & 7)) * 8), False)
        for lane in range(32 if D <= 128 else 0):
            c = lane % 4
            for k in range(D // 16):
                for (reg, row, off) in [(0, row_a[lane], 0), (1, row_b[lane], 0), (2, row_a[lane], 8), (3, row_b[lane], 8)]:
                    if row < qlen:
                        base = k * 16 + 2 * c + off
                        qa[k, lane, reg] = q[qs + row, head, base: base + 2]
        o = np.zeros((D // 8, 32, 4), np.float32)
        m_a = np.full(32, -np.inf, np.float32); m_b = np.full(32, -np.inf, np.float32)
        l_a = np.zeros(32, np.float32); l_b = np.zeros(32, np.float32)
        cc = lanes % 4
        for t in range(tiles):
            kt, vt = stages[t]
            k0 = t * ROWS
            if idle or k0 > warp_first + 15:
                continue
            sc = np.zeros((ROWS // 8, 32, 4), np.float32)
            for kb in range(ROWS // 16):
                rows = kb * 16 + (sub >> 1) * 8 + row8
                for k in range(D // 16):
                    addrs = rows * D + (((2 * k + (sub & 1)) ^ (rows & 7)) * 8)
                    b = ldmatrix_x4(kt, addrs, False)
                    sc[2 * kb] = mma(sc[2 * kb], qa[k], b[:, 0], b[:, 1])
                    sc[2 * kb + 1] = mma(sc[2 * kb + 1], qa[k], b[:, 2], b[:, 3])
            full = k0 + ROWS - 1 <= warp_first
            mx_a = np.full(32, -np.inf, np.float32); mx_b = np.full(32, -np.inf, np.float32)
            for j in range(ROWS // 8):
                for e in range(2):
                    key = k0 + 8 * j + 2 * cc + e
                    sc[j, :, e] = np.where(full | (key <= pos_a), sc[j, :, e] * scale, -np.inf)
                    sc[j, :, 2 + e] = np.where(full | (key <= pos_b), sc[j, :, 2 + e] * scale, -np.inf)
                    mx_a = np.maximum(mx_a, sc[j, :, e]); mx_b = np.maximum(mx_b, sc[j, :, 2 + e])
            for x in (1, 2):
                mx_a = np.maximum(mx_a, mx_a[lanes ^ x]); mx_b = np.maximum(mx_b, mx_b[lanes ^ x])
            new_a, new_b = np.maximum(m_a, mx_a), np.maximum(m_b, mx_b)
            base_a = np.where(new_a == -np.inf, 0, new_a); base_b = np.where(new_b == -np.inf, 0, new_b)
            corr_a, corr_b = np.exp(m_a - base_a), np.exp(m_b - base_b)
            m_a, m_b = new_a, new_b
            sum_a = np.zeros(32, np.float32); sum_b = np.zeros(32, np.float32)
            for j in range(ROWS // 8):
                for e in range(2):
                    sc[j, :, e] = np.exp(sc[j, :, e] - base_a)
                    sc[j, :, 2 + e] = np.exp(sc[j, :, 2 + e] - base_b)
                    sum_a += sc[j, :, e]; sum_b += sc[j, :, 2 + e]
            l_a = l_a * corr_a + sum_a; l_b = l_b * corr_b + sum_b
            o[:, :, 0:2] *= corr_a[None, :, None]; o[:, :, 2:4] *= corr_b[None, :, None]
            for kk in range(ROWS // 16):
                pa = np.zeros((32, 4, 2), np.float16)
                pa[:, 0] = sc[2 * kk, :, 0:2]; pa[:, 1] = sc[2 * kk, :, 2:4]
                pa[:, 2] = sc[2 * kk + 1, :, 0:2]; pa[:, 3] = sc[2 * kk + 1, :, 2:4]
                rows = kk * 16 + (sub & 1) * 8 + row8
                for nd in range(D // 16):
                    addrs = rows * D + (((2 * nd + (sub >> 1)) ^ (rows & 7)) * 8)
                    b = ldmatrix_x4(vt, addrs, True)
                    o[2 * nd] = mma(o[2 * nd], pa, b[:, 0], b[:, 1])
                    o[2 * nd + 1] = mma(o[2 * nd + 1], pa, b[:, 2], b[:, 3])
        for x in (1, 2):
            l_a = l_a + l_a[lanes ^ x]; l_b = l_b + l_b[lanes ^ x]
        for lane in range(32):
            c = lane % 4
            inv_a = 1 / l_a[lane] if l_a[lane] > 0 else 0
            inv_b = 1 / l_b[lane] if l_b[lane] > 0 else 0
            for n in range(D // 8):
                if row_a[lane] < qlen:
                    out[qs + row_a[lane], head, 8 * n + 2 * c: 8 * n + 2 * c + 2] = o[n, lane, 0:2] * inv_a
                if row_b[lane] < qlen:
                    out[qs + row_b[lane], head, 8 * n + 2 * c: 8 * n + 2 * c + 2] = o[n, lane, 2:4] * inv_b


def run(D, heads, kvh, seqs, bs=16, seed=0):
    rng = np.random.default_rng(seed)
    ctxs = [p + c for p, c in seqs]
    nblocks = sum((c + bs - 1) // bs for c in ctxs)
    ids = rng.permutation(np.arange(1, nblocks + 1))
    maxb = max((c + bs - 1) // bs for c in ctxs)
    kc = np.full((nblocks + 1, bs, kvh, D), np.nan, np.float16)
    vc = kc.copy()
    kc = kc.reshape(-1, kvh, D); vc = vc.reshape(-1, kvh, D)
    tables, nxt = [], 0
    keys, vals = [], []
    for c in ctxs:
        t = list(ids[nxt: nxt + (c + bs - 1) // bs]); nxt += len(t)
        t += [0] * (maxb - len(t)); tables.append(t)
        K = rng.standard_normal((c, kvh, D)).astype(np.float16); V = rng.standard_normal((c, kvh, D)).astype(np.float16)
        for p in range(c):
            slot = t[p // bs] * bs + p % bs
            kc[slot] = K[p]; vc[slot] = V[p]
        keys.append(K); vals.append(V)
    lead = 3
    total = lead + sum(c for _, c in seqs)
    q = rng.standard_normal((total, heads, D)).astype(np.float16)
    out = np.full((total, heads, D), np.nan, np.float32)
    scale = 1 / np.sqrt(D)
    starts, at = [], lead
    for _, c in seqs:
        starts.append(at); at += c
    maxq = max(c for _, c in seqs)
    grid_x = (maxq + ROWS - 1) // ROWS
    for s, (p, c) in enumerate(seqs):
        for h in range(heads):
            for bx in range(grid_x):
                tile0 = (grid_x - 1 - bx) * ROWS
                if tile0 >= c:
                    continue
                block(out, q, kc, vc, np.array(tables[s]), starts[s], c, p + c, h, h // (heads // kvh), tile0, heads, bs, D, scale)
    assert np.isnan(out[:lead]).all()
    err_num = err_den = 0.0
    for s, (p, c) in enumerate(seqs):
        for i in range(c):
            pos = p + i
            for h in range(heads):
                g = h // (heads // kvh)
                qv = q[starts[s] + i, h].astype(np.float64)
                sc = keys[s][: pos + 1, g].astype(np.float64) @ qv * scale
                w = np.exp(sc - sc.max()); w /= w.sum()
                want = w @ vals[s][: pos + 1, g].astype(np.float64)
                got = out[starts[s] + i, h]
                assert not np.isnan(got).any(), (s, i, h)
                err_num += ((got - want) ** 2).sum(); err_den += (want ** 2).sum()
    return np.sqrt(err_num / err_den)


if __name__ == "__main__":
    for D, heads, kvh, seqs in [(64, 4, 2, [(0, 1), (0, 70), (37, 20)]), (128, 2, 1, [(5, 3), (130, 90)]),
                                (64, 2, 2, [(0, 130)]), (256, 2, 1, [(5, 3), (20, 70)])]:
        print(D, heads, kvh, seqs, "rel err", run(D, heads, kvh, seqs))
