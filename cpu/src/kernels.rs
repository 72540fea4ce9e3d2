//! Dot products of a range of weight rows against every activation row, with the SIMD kernels
//! when the CPU has them (checked once, at run time) and the scalar reference otherwise.

use std::sync::OnceLock;

use super::blocks::{
    Act, Bytes, Nibbles, Nibbles8, dot_bytes_scalar, dot_nibbles_scalar, dot_nibbles8_scalar,
};
use super::q4k::{Q4K8, dot_q4k8_scalar};
use super::q6k::{Q6K8, dot_q6k8_scalar};

/// Which dot products run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The scalar reference.
    Scalar,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Isa {
    /// The best this CPU runs.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Isa::Avx2;
            }
            Isa::Scalar
        })
    }
}

/// A weight block format the kernels take.
pub trait WeightBlock: Copy + Send + Sync {
    /// The scalar reference dot product of one row against one activation row.
    fn dot_scalar(w: &[Self], a: &[Act]) -> f32;
    /// The same against `R` activation rows at once, with `isa`.
    fn dot_rows<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [f32; R];
}

impl WeightBlock for Nibbles {
    fn dot_scalar(w: &[Self], a: &[Act]) -> f32 {
        dot_nibbles_scalar(w, a)
    }

    fn dot_rows<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [f32; R] {
        match isa {
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::avx2::dot_nibbles(w, a) },
            Isa::Scalar => a.map(|row| dot_nibbles_scalar(w, row)),
        }
    }
}

impl WeightBlock for Bytes {
    fn dot_scalar(w: &[Self], a: &[Act]) -> f32 {
        dot_bytes_scalar(w, a)
    }

    fn dot_rows<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [f32; R] {
        match isa {
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::avx2::dot_bytes(w, a) },
            Isa::Scalar => a.map(|row| dot_bytes_scalar(w, row)),
        }
    }
}

/// For every weight row `r` in `rows` (of `blocks` blocks each in `w`) and every activation row
/// `i` of `acts` (`blocks` blocks each), calls `store(i, r, dot)`.
pub fn dot_range<B: WeightBlock>(
    isa: Isa,
    w: &[B],
    acts: &[Act],
    blocks: usize,
    rows: std::ops::Range<usize>,
    mut store: impl FnMut(usize, usize, f32),
) {
    let m = acts.len() / blocks;
    let act = |i: usize| &acts[i * blocks..(i + 1) * blocks];
    for r in rows {
        let wr = &w[r * blocks..(r + 1) * blocks];
        let mut i = 0;
        while i + 4 <= m {
            let d = B::dot_rows(isa, wr, [act(i), act(i + 1), act(i + 2), act(i + 3)]);
            for (j, v) in d.into_iter().enumerate() {
                store(i + j, r, v);
            }
            i += 4;
        }
        while i + 2 <= m {
            let d = B::dot_rows(isa, wr, [act(i), act(i + 1)]);
            store(i, r, d[0]);
            store(i + 1, r, d[1]);
            i += 2;
        }
        if i < m {
            store(i, r, B::dot_rows(isa, wr, [act(i)])[0]);
        }
    }
}

/// An interleaved format of 8 rows a group.
pub trait GroupBlock: Copy + Send + Sync {
    /// Weights a row in one block (a multiple of the activations' 32).
    const WEIGHTS: usize;
    /// The 8 rows of `w` (one group, all its blocks) against `R` activation rows, with `isa`.
    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [[f32; 8]; R];
}

impl GroupBlock for Nibbles8 {
    const WEIGHTS: usize = 32;

    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [[f32; 8]; R] {
        match isa {
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::avx2::dot_nibbles8(w, a) },
            Isa::Scalar => a.map(|row| dot_nibbles8_scalar(w, row)),
        }
    }
}

impl GroupBlock for Q4K8 {
    const WEIGHTS: usize = 256;

    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [[f32; 8]; R] {
        match isa {
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::avx2::dot_q4k8(w, a) },
            Isa::Scalar => a.map(|row| dot_q4k8_scalar(w, row)),
        }
    }
}

impl GroupBlock for Q6K8 {
    const WEIGHTS: usize = 256;

    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[Act]; R]) -> [[f32; 8]; R] {
        match isa {
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { super::avx2::dot_q6k8(w, a) },
            Isa::Scalar => a.map(|row| dot_q6k8_scalar(w, row)),
        }
    }
}

/// Activation bytes a pass over the weights takes at most: a long prompt's activations are
/// split in runs that stay in the L2 cache while every weight row is multiplied by them.
const ACT_RUN_BYTES: usize = 256 * 1024;

/// Activation rows a run holds at `per_act` blocks a row (a multiple of 4, the tile).
pub fn act_run(per_act: usize) -> usize {
    (ACT_RUN_BYTES / (per_act * std::mem::size_of::<Act>()) / 4 * 4).max(4)
}

/// [`dot_range`] for an interleaved format: `groups` of 8 rows of `cols` weights in `w`;
/// `store(i, r, dot)` for every row `r` of those groups.
pub fn dot_groups<B: GroupBlock>(
    isa: Isa,
    w: &[B],
    acts: &[Act],
    cols: usize,
    groups: std::ops::Range<usize>,
    store: impl FnMut(usize, usize, f32),
) {
    dot_groups_in_runs(isa, w, acts, cols, groups, act_run(cols / 32), store)
}

/// [`dot_groups`] taking the activation rows `run` at a time: every group against the first
/// `run` rows, then against the next.
pub fn dot_groups_in_runs<B: GroupBlock>(
    isa: Isa,
    w: &[B],
    acts: &[Act],
    cols: usize,
    groups: std::ops::Range<usize>,
    run: usize,
    mut store: impl FnMut(usize, usize, f32),
) {
    let (per_act, per_group) = (cols / 32, cols / B::WEIGHTS);
    let m = acts.len() / per_act;
    let act = |i: usize| &acts[i * per_act..(i + 1) * per_act];
    for first in (0..m).step_by(run.max(1)) {
        let end = (first + run.max(1)).min(m);
        for g in groups.clone() {
            let wg = &w[g * per_group..(g + 1) * per_group];
            let mut put = |i: usize, dots: [f32; 8]| {
                for (r, v) in dots.into_iter().enumerate() {
                    store(i, 8 * g + r, v);
                }
            };
            let mut i = first;
            while i + 4 <= end {
                let d = B::dot_group(isa, wg, [act(i), act(i + 1), act(i + 2), act(i + 3)]);
                for (j, dots) in d.into_iter().enumerate() {
                    put(i + j, dots);
                }
                i += 4;
            }
            if i + 2 <= end {
                let [d0, d1] = B::dot_group(isa, wg, [act(i), act(i + 1)]);
                put(i, d0);
                put(i + 1, d1);
                i += 2;
            }
            if i < end {
                put(i, B::dot_group(isa, wg, [act(i)])[0]);
            }
        }
    }
}
