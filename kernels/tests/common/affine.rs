//! Random weights of integer codes with a (scale, offset) pair per group, packed here by the
//! layout's own description (the affine GEMV and expert tests).
#![allow(dead_code)] // (not every test binary uses codes)

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{AffineMatrix, CodeBits};

use super::Lcg;

/// A random weight of codes on `dev`: codes (packed), (scale, offset) pairs, values on the host.
/// Scales random f16 values, offsets random f16 values of either sign (not whole codes), or
/// (`exact`) powers of two and whole multiples of them (every value then exact in bf16).
pub struct Weight {
    pub codes: Tensor,
    pub pairs: Tensor,
    pub group: usize,
    pub bits: CodeBits,
    pub values: Vec<f32>,
}

impl Weight {
    pub fn new(
        rng: &mut Lcg,
        bits: CodeBits,
        (out, k): (usize, usize),
        group: usize,
        exact: bool,
        dev: &Device,
    ) -> Self {
        let groups = k.div_ceil(group);
        let top = (1usize << bits.bits()) as f32;
        let q: Vec<u8> = (0..out * k)
            .map(|_| ((rng.next() + 1.0) * top / 2.0) as usize as u8)
            .collect();
        let mut pairs = Vec::with_capacity(out * groups * 2);
        for _ in 0..out * groups {
            let (scale, offset) = match exact {
                true => {
                    let s = 2f32.powi((rng.next() * 4.0) as i32 - 9);
                    (s, -s * ((rng.next() + 1.0) * top / 2.0).floor())
                }
                false => (
                    half_round((1e-3 + (rng.next() + 1.0) * 4e-3) * 16.0 / top),
                    half_round(rng.next() * 0.03),
                ),
            };
            pairs.extend([scale, offset]);
        }
        let values = (0..out * k)
            .map(|i| {
                let at = 2 * ((i / k) * groups + (i % k) / group);
                pairs[at] * f32::from(q[i]) + pairs[at + 1]
            })
            .collect();
        let bytes = match bits {
            // Word j of a row: column 8j + 2i in nibble i, column 8j + 2i + 1 in nibble 4 + i.
            CodeBits::Four => {
                let mut bytes = vec![0u8; out * k / 2];
                for (i, &code) in q.iter().enumerate() {
                    let (word, c) = (i / 8, i % 8);
                    let nibble = if c % 2 == 0 { c / 2 } else { 4 + c / 2 };
                    bytes[4 * word + nibble / 2] |= code << (4 * (nibble % 2));
                }
                bytes
            }
            CodeBits::Eight => q,
        };
        let width = out * k * bits.bits() / 8 / out;
        let pairs_host = Tensor::from_vec(pairs, (out, groups, 2), &Device::Cpu).unwrap();
        Weight {
            codes: Tensor::from_vec(bytes, (out, width), dev).unwrap(),
            pairs: pairs_host
                .to_dtype(DType::F16)
                .unwrap()
                .to_device(dev)
                .unwrap(),
            group,
            bits,
            values,
        }
    }

    pub fn matrix(&self) -> AffineMatrix<'_> {
        AffineMatrix {
            codes: &self.codes,
            scale_offset: &self.pairs,
            group: self.group,
            bits: self.bits,
        }
    }
}

/// `v` rounded to f16.
pub fn half_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}
