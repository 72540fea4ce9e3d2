"""A lane-level emulation of kernels/csrc/gemv_mma.cu's tile loop on the CPU, for checking its
index math without a GPU: each lane's 16-byte loads (weight rows g and g + 8, staged row g, at
columns k + 8c), the two mma.m16n8k16 per 32 columns by the PTX ISA's fragment layouts (the same
model as prefill_mma_emu.py), the warps' split of k with the software-pipelined groups and the
remainder, and the block's sum of the warps' tiles into y. It mirrors the kernel; change both
together. Inputs are multiples of 1/16, so every sum is exact and the result must equal the
reference exactly:

    python3 scripts/dev/gemv_mma_emu.py      (pure Python; a few seconds)
"""
import random

WARPS = 16  # kGemvWarps
STEP_K = 32  # kStepK
STRIDE = WARPS * STEP_K
STEPS = 2  # kSteps
GROUP = STEPS * STRIDE


def mma(acc, afrag, b0, b1):
    """acc[lane][4] += A B for m16n8k16: afrag[lane] = 4 pairs, b0/b1[lane] = pairs."""
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for lane in range(32):
        g, c = lane // 4, lane % 4
        A[g][2 * c: 2 * c + 2] = afrag[lane][0]
        A[g + 8][2 * c: 2 * c + 2] = afrag[lane][1]
        A[g][2 * c + 8: 2 * c + 10] = afrag[lane][2]
        A[g + 8][2 * c + 8: 2 * c + 10] = afrag[lane][3]
        B[2 * c][g], B[2 * c + 1][g] = b0[lane]
        B[2 * c + 8][g], B[2 * c + 9][g] = b1[lane]
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for e in range(4):
            row = g + (8 if e >= 2 else 0)
            col = 2 * c + (e & 1)
            acc[lane][e] += sum(A[row][kk] * B[kk][col] for kk in range(16))


def tile(w, xs, rows, out_dim, k_dim, o0):
    """One block's tile of 16 outputs: y values {(r, o): v} as the kernel stores them."""
    def load_a(k):  # per lane: (weight row g's 8 columns, row g + 8's)
        assert 0 <= k and k + STEP_K <= k_dim, f"a load at column {k} of {k_dim}"
        res = []
        for lane in range(32):
            g, c = lane // 4, lane % 4
            ra, rb = min(o0 + g, out_dim - 1), min(o0 + g + 8, out_dim - 1)
            res.append((w[ra][k + 8 * c: k + 8 * c + 8], w[rb][k + 8 * c: k + 8 * c + 8]))
        return res

    def load_b(k):  # per lane: staged row g's 8 columns (zeros past the rows)
        assert 0 <= k and k + STEP_K <= k_dim, f"a load at column {k} of {k_dim}"
        res = []
        for lane in range(32):
            g, c = lane // 4, lane % 4
            res.append(xs[g][k + 8 * c: k + 8 * c + 8] if g < rows else [0.0] * 8)
        return res

    def step(acc, a, b):
        a1 = [[a[l][0][0:2], a[l][1][0:2], a[l][0][2:4], a[l][1][2:4]] for l in range(32)]
        mma(acc, a1, [b[l][0:2] for l in range(32)], [b[l][2:4] for l in range(32)])
        a2 = [[a[l][0][4:6], a[l][1][4:6], a[l][0][6:8], a[l][1][6:8]] for l in range(32)]
        mma(acc, a2, [b[l][4:6] for l in range(32)], [b[l][6:8] for l in range(32)])

    sums = []
    for warp in range(WARPS):
        acc = [[0.0] * 4 for _ in range(32)]
        k = warp * STEP_K
        whole = k + GROUP - STRIDE < k_dim
        cur = [load_a(k + u * STRIDE) for u in range(STEPS)] if whole else None
        while whole and k + GROUP - STRIDE < k_dim:
            more = k + 2 * GROUP - STRIDE < k_dim
            nxt = [load_a(k + GROUP + u * STRIDE) if more else cur[u] for u in range(STEPS)]
            for u in range(STEPS):
                step(acc, cur[u], load_b(k + u * STRIDE))
            cur = nxt
            k += GROUP
        while k < k_dim:
            step(acc, load_a(k), load_b(k))
            k += STRIDE
        sums.append(acc)
    y = {}
    for t in range(32 * 4):
        l, e = t % 32, t // 32
        o = o0 + l // 4 + (8 if e >= 2 else 0)
        r = 2 * (l % 4) + (e & 1)
        if o < out_dim and r < rows:
            y[(r, o)] = sum(sums[wp][l][e] for wp in range(WARPS))
    return y


def check(rows, out_dim, k_dim, rng):
    w = [[rng.randint(-16, 16) / 16 for _ in range(k_dim)] for _ in range(out_dim)]
    xs = [[rng.randint(-32, 32) / 16 for _ in range(k_dim)] for _ in range(rows)]
    y = {}
    for o0 in range(0, out_dim, 16):
        y.update(tile(w, xs, rows, out_dim, k_dim, o0))
    assert len(y) == rows * out_dim, f"{len(y)} of {rows * out_dim} outputs written"
    for r in range(rows):
        for o in range(out_dim):
            want = sum(xs[r][k] * w[o][k] for k in range(k_dim))
            assert y[(r, o)] == want, f"{rows}x{out_dim}x{k_dim}: y[{r}, {o}] {y[(r, o)]} != {want}"
    print(f"rows {rows}, out {out_dim}, k {k_dim}: exact")


if __name__ == "__main__":
    rng = random.Random(7)
    # k steps a warp: 1 (no group), 3 (a group and one more), 5, 8 (whole groups only).
    for rows, out_dim, k_dim in [(5, 33, 512), (3, 40, 1536), (4, 20, 2560), (8, 16, 4096)]:
        check(rows, out_dim, k_dim, rng)
