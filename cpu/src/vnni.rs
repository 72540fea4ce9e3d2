//! The `vpdpbusd` the SIMD kernels use when the CPU has one (`V`, [`super::kernels::Vnni`]):
//! four products of unsigned and signed bytes summed into each 32-bit lane.

use std::arch::x86_64::__m256i;

/// The kernels' `V`: AVX2's `vpmaddubsw` and widening, no `vpdpbusd`.
pub(super) const NO_VNNI: u8 = 0;
/// The kernels' `V`: AVX-VNNI's `vpdpbusd` (VEX; Intel since Alder Lake, AMD since Zen 5).
pub(super) const VNNI_VEX: u8 = 1;
/// The kernels' `V`: AVX512-VNNI's `vpdpbusd` on 256 bits (EVEX, with AVX512VL; Intel Xeons since
/// Cascade Lake, AMD since Zen 4).
pub(super) const VNNI_EVEX: u8 = 2;

/// `acc` plus, in each 32-bit lane, the four products of `u`'s unsigned bytes and `s`'s signed
/// ones: `vpdpbusd` in `V`'s encoding. Only the `V != NO_VNNI` instantiations call it, which run
/// only on a CPU that has that encoding (`Isa::Avx2 { vnni }`). One instruction of inline
/// assembly rather than the intrinsic, so that it is inlined into every helper whatever the
/// helper's own target features (an intrinsic of a feature the helper lacks becomes an
/// out-of-line call), and so that the kernels need no AVX-512 code generation.
#[inline(always)]
pub(super) fn vnni<const V: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: a register-only instruction; the callers run only where the CPU has it.
    macro_rules! dpbusd {
        ($encoding:literal) => {
            std::arch::asm!(
                concat!("{{", $encoding, "}} vpdpbusd {acc}, {u}, {s}"),
                acc = inout(ymm_reg) acc,
                u = in(ymm_reg) u,
                s = in(ymm_reg) s,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
    }
    unsafe {
        if V == VNNI_EVEX {
            dpbusd!("evex");
        } else {
            dpbusd!("vex");
        }
    }
    acc
}
