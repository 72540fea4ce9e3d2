//! Dot products of a range of 8-row weight groups against every activation row, with the SIMD kernels
//! when the CPU has them (checked once, at run time) and the scalar reference otherwise.

use std::sync::OnceLock;

use super::act_k::ActK;
use super::bf16::dot_bf16x8_scalar;
use super::blocks::{Act, Nibbles8, dot_nibbles8_scalar};
use super::fives::{Fives8, dot_fives8_scalar};
use super::halves::{Bf16x8, F16x8, HALF_COLS, dot_f16x8_scalar};
use super::iq4::{Iq4Nl8, Iq4Xs8, dot_iq4nl8_scalar, dot_iq4xs8_scalar};
use super::q4k::{Q4K8, dot_q4k8_scalar};
use super::q5k::{Q5K8, dot_q5k8_scalar};
use super::q6k::{Q6K8, dot_q6k8_scalar};
use super::q8::{Bytes8, dot_bytes8_scalar};
use super::q23k::{Q2K8, Q3K8, dot_q2k8_scalar, dot_q3k8_scalar};

/// Which dot products run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The scalar reference.
    Scalar,
    /// AVX2 + FMA + F16C, with the byte products by `vpdpbusd` when the CPU has it.
    #[cfg(target_arch = "x86_64")]
    Avx2 {
        /// Which `vpdpbusd`, if any.
        vnni: Vnni,
    },
}

/// The `vpdpbusd` (four byte products summed into 32 bits) the AVX2 kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vnni {
    /// None: `vpmaddubsw`, then widening.
    No,
    /// AVX512-VNNI's on 256-bit registers, the kernels compiled with AVX-512 (F, VL, BW, VNNI)
    /// on: still 256-bit, but with AVX-512's 32 vector registers, which take the 4-row tiles'
    /// accumulators and unpacked weights without spilling (1.1-1.5x the 64-row GMAC/s of the
    /// same kernels on 16 registers, Zen 4). Intel Xeons since Cascade Lake, AMD since Zen 4.
    Avx512,
    /// As `Avx512`, and AVX512-BF16's `vdpbf16ps` for BF16 weights (two products of 16-bit
    /// floats added into each f32 lane): Intel since Cooper Lake, AMD since Zen 4.
    Avx512Bf16,
    /// AVX-VNNI's: Intel since Alder Lake, AMD since Zen 5.
    Avx,
}

impl Vnni {
    /// Whether the kernels are compiled with AVX-512 on (F, VL, BW and VNNI: 32 registers).
    pub fn avx512(self) -> bool {
        matches!(self, Vnni::Avx512 | Vnni::Avx512Bf16)
    }
}

impl Isa {
    /// The best this CPU runs.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| *Isa::available().last().unwrap())
    }

    /// Every choice this CPU runs, the scalar reference first and the best last (tests and
    /// benchmarks compare them).
    pub fn available() -> Vec<Isa> {
        let mut all = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            all.push(Isa::Avx2 { vnni: Vnni::No });
            if is_x86_feature_detected!("avxvnni") {
                all.push(Isa::Avx2 { vnni: Vnni::Avx });
            }
            // Last, the best: where both are, the 32 registers win.
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
            {
                all.push(Isa::Avx2 { vnni: Vnni::Avx512 });
                if is_x86_feature_detected!("avx512bf16") {
                    all.push(Isa::Avx2 {
                        vnni: Vnni::Avx512Bf16,
                    });
                }
            }
        }
        all
    }
}

/// An interleaved format of 8 rows a group.
pub trait GroupBlock: Copy + Send + Sync {
    /// Weights a row in one block (a multiple of [`GroupBlock::ACT_COLS`]).
    const WEIGHTS: usize;
    /// What the weights are multiplied by: activation blocks quantized to 8 bits ([`Act`]), or
    /// f32 activations as they are (16-bit float weights).
    type Act: Sync;
    /// Columns of an activation row that one [`GroupBlock::Act`] holds.
    const ACT_COLS: usize;
    /// The 8 rows of `w` (one group, all its blocks) against `R` activation rows, with `isa`.
    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[Self::Act]; R]) -> [[f32; 8]; R];
    /// Row `r`'s weight `i` (of [`GroupBlock::WEIGHTS`]) in this block, as GGML dequantizes it.
    fn weight(&self, r: usize, i: usize) -> f32;
    /// Whether 8 activation rows a call beat 4 with AVX-512's 32 registers: a block's unpacking
    /// (or conversion) then serves twice the rows. Measured on Zen 4 (64-row GMAC/s, the
    /// `bandwidth` test, builds alternated), with the row loops written out (`each_row!`): Q5_K,
    /// Q2_K and Q6_K faster (Q6_K 158-160 -> 168-171); Q4_0 to Q5_1 and Q4_K 10-20% slower,
    /// Q3_K 12%, IQ4 alike. (F16 and BF16 keep the columns in the lanes: their tiles stay at 4.)
    const TILE8: bool = false;
    /// Two groups (16 rows) of `w0` and `w1` against `R` activation rows in 512-bit lanes
    /// (`avx512_pair`: half the activation broadcasts a product; [`dot_groups`] takes it for
    /// tiles of 4 and 8 rows). Called only where [`GroupBlock::pairs`] says `isa` has it.
    fn dot_pair<const R: usize>(
        _isa: Isa,
        _w0: &[Self],
        _w1: &[Self],
        _a: [&[Self::Act]; R],
    ) -> [[f32; 16]; R] {
        unreachable!("no pair kernel: `pairs` is false for this format")
    }
    /// Whether [`GroupBlock::dot_pair`] has a kernel for `isa`.
    fn pairs(_isa: Isa) -> bool {
        false
    }
}

/// Implements [`GroupBlock`] for a format from its AVX2 kernel (generic over the `vpdpbusd` it
/// uses, `V`) and scalar reference: one entry point enables AVX2, FMA and F16C, so that the kernel
/// and its helpers are compiled, inlined, for each `V`.
macro_rules! group_block {
    ($block:ty, $weights:expr, $avx2:ident, $scalar:ident) => {
        group_block!($block, $weights, $avx2, $scalar, false);
    };
    ($block:ty, $weights:expr, $avx2:ident, $scalar:ident, $tile8:expr) => {
        group_block!($block, $weights, $avx2, $scalar, $tile8, Act, 32);
    };
    ($block:ty, $weights:expr, $avx2:ident, $scalar:ident, $tile8:expr, $act:ty, $act_cols:expr
        $(, pair $pair:ident)?) => {
        impl GroupBlock for $block {
            const WEIGHTS: usize = $weights;
            const TILE8: bool = $tile8;
            type Act = $act;
            const ACT_COLS: usize = $act_cols;

            fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[$act]; R]) -> [[f32; 8]; R] {
                #[cfg(target_arch = "x86_64")]
                #[target_feature(enable = "avx2,fma,f16c")]
                fn avx2<const R: usize, const V: u8>(
                    w: &[$block],
                    a: [&[$act]; R],
                ) -> [[f32; 8]; R] {
                    super::avx2::$avx2::<R, V>(w, a)
                }
                // The same kernel with AVX-512 on: its 32 registers (`Vnni::Avx512`).
                #[cfg(target_arch = "x86_64")]
                #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
                fn avx512<const R: usize, const V: u8>(
                    w: &[$block],
                    a: [&[$act]; R],
                ) -> [[f32; 8]; R] {
                    super::avx2::$avx2::<R, V>(w, a)
                }
                #[cfg(target_arch = "x86_64")]
                use super::vnni::{NO_VNNI, VNNI_EVEX, VNNI_VEX};
                match isa {
                    // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C, and
                    // with a `vnni` only when it also has that `vpdpbusd` (for `Vnni::Avx512`,
                    // AVX-512 F, VL, BW and VNNI).
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 { vnni: Vnni::No } => unsafe { avx2::<R, NO_VNNI>(w, a) },
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 { vnni: Vnni::Avx } => unsafe { avx2::<R, VNNI_VEX>(w, a) },
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 {
                        vnni: Vnni::Avx512 | Vnni::Avx512Bf16,
                    } => unsafe { avx512::<R, VNNI_EVEX>(w, a) },
                    Isa::Scalar => a.map(|row| $scalar(w, row)),
                }
            }

            fn weight(&self, r: usize, i: usize) -> f32 {
                <$block>::weight(self, r, i)
            }

            $(
            fn dot_pair<const R: usize>(
                isa: Isa,
                w0: &[Self],
                w1: &[Self],
                a: [&[$act]; R],
            ) -> [[f32; 16]; R] {
                match isa {
                    // SAFETY: `Vnni::Avx512*` exists only when the CPU has AVX-512 F, VL, BW
                    // and VNNI (and AVX2, FMA, F16C); DQ comes with them on every such CPU.
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 { vnni } if vnni.avx512() => unsafe {
                        super::avx512_pair::$pair::<R>(w0, w1, a)
                    },
                    _ => unreachable!("no pair kernel for {isa:?}: `pairs` is false"),
                }
            }

            fn pairs(isa: Isa) -> bool {
                #[cfg(target_arch = "x86_64")]
                if let Isa::Avx2 { vnni } = isa {
                    return vnni.avx512();
                }
                let _ = isa;
                false
            }
            )?
        }
    };
}

group_block!(Nibbles8, 32, dot_nibbles8, dot_nibbles8_scalar);
group_block!(Fives8, 32, dot_fives8, dot_fives8_scalar);
group_block!(Bytes8, 32, dot_bytes8, dot_bytes8_scalar);
group_block!(Q4K8, 256, dot_q4k8, dot_q4k8_scalar, false, ActK, 256, pair dot_q4k16);
group_block!(Q5K8, 256, dot_q5k8, dot_q5k8_scalar, true, ActK, 256, pair dot_q5k16);
group_block!(Q6K8, 256, dot_q6k8, dot_q6k8_scalar, true, ActK, 256, pair dot_q6k16);
group_block!(Iq4Nl8, 32, dot_iq4nl8, dot_iq4nl8_scalar);
group_block!(Iq4Xs8, 256, dot_iq4xs8, dot_iq4xs8_scalar, false, ActK, 256, pair dot_iq4xs16);

group_block!(Q2K8, 256, dot_q2k8, dot_q2k8_scalar, true, ActK, 256);
group_block!(Q3K8, 256, dot_q3k8, dot_q3k8_scalar, false, ActK, 256);

/// F16 weights, multiplied by f32 activations (one kernel whatever the VNNI): a decode row against
/// all 8 weight rows in one pass (one stream through the group's memory), more rows 4 weight rows
/// at a time with AVX-512's 32 registers, else 2.
impl GroupBlock for F16x8 {
    const WEIGHTS: usize = HALF_COLS;
    type Act = f32;
    const ACT_COLS: usize = 1;

    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[f32]; R]) -> [[f32; 8]; R] {
        // The kernel compiled with AVX-512 on, as `Vnni::Avx512`'s (its 32 registers).
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        fn avx512<const R: usize>(w: &[F16x8], a: [&[f32]; R]) -> [[f32; 8]; R] {
            match R {
                1 => super::halves::dot_f16x8::<R, 8>(w, a),
                _ => super::halves::dot_f16x8::<R, 4>(w, a),
            }
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn avx2<const R: usize>(w: &[F16x8], a: [&[f32]; R]) -> [[f32; 8]; R] {
            match R {
                1 => super::halves::dot_f16x8::<R, 8>(w, a),
                _ => super::halves::dot_f16x8::<R, 2>(w, a),
            }
        }
        match isa {
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2, FMA and F16C, and with
            // `Vnni::Avx512*` only when it also has AVX-512 F, VL, BW and VNNI.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 { vnni } if vnni.avx512() => unsafe { avx512::<R>(w, a) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 { .. } => unsafe { avx2::<R>(w, a) },
            Isa::Scalar => a.map(|row| dot_f16x8_scalar(w, row)),
        }
    }

    fn weight(&self, r: usize, i: usize) -> f32 {
        F16x8::weight(self, r, i)
    }
}

/// BF16 weights, multiplied by activations rounded to BF16 (pairs of them in a `u32`): with
/// AVX512-BF16's `vdpbf16ps`, else widened to f32; weight rows a pass as for F16.
impl GroupBlock for Bf16x8 {
    const WEIGHTS: usize = HALF_COLS;
    type Act = u32;
    const ACT_COLS: usize = 2;

    fn dot_group<const R: usize>(isa: Isa, w: &[Self], a: [&[u32]; R]) -> [[f32; 8]; R] {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni,avx512bf16")]
        fn dp<const R: usize>(w: &[Bf16x8], a: [&[u32]; R]) -> [[f32; 8]; R] {
            match R {
                1 => super::bf16::dot_bf16x8_dp::<R, 8>(w, a),
                _ => super::bf16::dot_bf16x8_dp::<R, 4>(w, a),
            }
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        fn avx512<const R: usize>(w: &[Bf16x8], a: [&[u32]; R]) -> [[f32; 8]; R] {
            match R {
                1 => super::bf16::dot_bf16x8::<R, 8>(w, a),
                _ => super::bf16::dot_bf16x8::<R, 4>(w, a),
            }
        }
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        fn avx2<const R: usize>(w: &[Bf16x8], a: [&[u32]; R]) -> [[f32; 8]; R] {
            match R {
                1 => super::bf16::dot_bf16x8::<R, 8>(w, a),
                _ => super::bf16::dot_bf16x8::<R, 2>(w, a),
            }
        }
        match isa {
            // SAFETY: `Vnni::Avx512Bf16` exists only when the CPU has AVX-512 F, VL, BW, VNNI
            // and BF16 (and AVX2, FMA and F16C); `Vnni::Avx512` without BF16; `Isa::Avx2` only
            // when it has AVX2, FMA and F16C.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 {
                vnni: Vnni::Avx512Bf16,
            } => unsafe { dp::<R>(w, a) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 { vnni: Vnni::Avx512 } => unsafe { avx512::<R>(w, a) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 { .. } => unsafe { avx2::<R>(w, a) },
            Isa::Scalar => a.map(|row| dot_bf16x8_scalar(w, row)),
        }
    }

    fn weight(&self, r: usize, i: usize) -> f32 {
        Bf16x8::weight(self, r, i)
    }
}

/// Activation bytes a pass over the weights takes at most: a long prompt's activations are
/// split in runs that stay in the L2 cache while every weight row is multiplied by them.
const ACT_RUN_BYTES: usize = 256 * 1024;

/// Activation rows a run holds at `row_bytes` bytes a row (a multiple of 8, the widest tile).
pub fn act_run(row_bytes: usize) -> usize {
    (ACT_RUN_BYTES / row_bytes / 8 * 8).max(8)
}

/// The most activation rows one kernel call takes for format `B` with `isa`: 8 where the format
/// asks for it ([`GroupBlock::TILE8`]) and the kernels are compiled with AVX-512's 32 vector
/// registers (an 8-row tile's accumulators fit), else 4.
pub fn widest_tile<B: GroupBlock>(isa: Isa) -> usize {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 { vnni } if vnni.avx512() && B::TILE8 => 8,
        _ => 4,
    }
}

/// For an interleaved format: `groups` of 8 rows of `cols` weights in `w`;
/// `store(i, r, dot)` for every row `r` of those groups.
pub fn dot_groups<B: GroupBlock>(
    isa: Isa,
    w: &[B],
    acts: &[B::Act],
    cols: usize,
    groups: std::ops::Range<usize>,
    store: impl FnMut(usize, usize, f32),
) {
    let row_bytes = cols / B::ACT_COLS * std::mem::size_of::<B::Act>();
    dot_groups_in_runs(isa, w, acts, cols, groups, act_run(row_bytes), store)
}

/// [`dot_groups`] taking the activation rows `run` at a time: every group against the first
/// `run` rows, then against the next.
pub fn dot_groups_in_runs<B: GroupBlock>(
    isa: Isa,
    w: &[B],
    acts: &[B::Act],
    cols: usize,
    groups: std::ops::Range<usize>,
    run: usize,
    mut store: impl FnMut(usize, usize, f32),
) {
    let (per_act, per_group) = (cols / B::ACT_COLS, cols / B::WEIGHTS);
    let m = acts.len() / per_act;
    let act = |i: usize| &acts[i * per_act..(i + 1) * per_act];
    for first in (0..m).step_by(run.max(1)) {
        let end = (first + run.max(1)).min(m);
        let mut g = groups.start;
        // (Pairs only for 4 rows or more: one decode row reads one group's stream at a time.)
        while B::pairs(isa) && end - first >= 4 && g + 2 <= groups.end {
            let (w0, w1) = (
                &w[g * per_group..(g + 1) * per_group],
                &w[(g + 1) * per_group..(g + 2) * per_group],
            );
            let mut put = |i: usize, dots: [f32; 16]| {
                for (r, v) in dots.into_iter().enumerate() {
                    store(i, 8 * g + r, v);
                }
            };
            let mut i = first;
            while widest_tile::<B>(isa) == 8 && i + 8 <= end {
                let d = B::dot_pair(isa, w0, w1, std::array::from_fn::<_, 8, _>(|j| act(i + j)));
                for (j, dots) in d.into_iter().enumerate() {
                    put(i + j, dots);
                }
                i += 8;
            }
            while i + 4 <= end {
                let d = B::dot_pair(isa, w0, w1, [act(i), act(i + 1), act(i + 2), act(i + 3)]);
                for (j, dots) in d.into_iter().enumerate() {
                    put(i + j, dots);
                }
                i += 4;
            }
            group_tiles(isa, w0, g, i..end, &act, &mut store);
            group_tiles(isa, w1, g + 1, i..end, &act, &mut store);
            g += 2;
        }
        for g in g..groups.end {
            let wg = &w[g * per_group..(g + 1) * per_group];
            group_tiles(isa, wg, g, first..end, &act, &mut store);
        }
    }
}

/// Group `g` (its blocks `wg`) against the activation rows `rows`, in the widest tiles that fit
/// (8 where [`widest_tile`] says so, then 4, 2, 1); `store(i, r, dot)` for each.
fn group_tiles<'a, B: GroupBlock>(
    isa: Isa,
    wg: &[B],
    g: usize,
    rows: std::ops::Range<usize>,
    act: &impl Fn(usize) -> &'a [B::Act],
    store: &mut impl FnMut(usize, usize, f32),
) where
    B::Act: 'a,
{
    let mut put = |i: usize, dots: [f32; 8]| {
        for (r, v) in dots.into_iter().enumerate() {
            store(i, 8 * g + r, v);
        }
    };
    let (mut i, end) = (rows.start, rows.end);
    while widest_tile::<B>(isa) == 8 && i + 8 <= end {
        let d = B::dot_group(isa, wg, std::array::from_fn::<_, 8, _>(|j| act(i + j)));
        for (j, dots) in d.into_iter().enumerate() {
            put(i + j, dots);
        }
        i += 8;
    }
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
