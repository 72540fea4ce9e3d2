//! MXFP4 (the OCP microscaling format), as gpt-oss ships its experts' weights: each run of 32
//! values is 16 bytes of FP4 (E2M1) codes, two a byte (the low nibble first), and one E8M0 scale
//! byte (`2^(s - 127)`). Safetensors checkpoints store a tensor `[.., rows, cols]` as
//! `NAME_blocks` (`[.., rows, cols / 32, 16]`, u8) and `NAME_scales` (`[.., rows, cols / 32]`).
//! llama.cpp's GGUF files store them as ggml's MXFP4 blocks ([`dequantize_ggml`]). pagewise
//! dequantizes them at load to the model dtype.

use candle_core::{Device, Tensor};

use super::ModelError;
use super::weights::Weights;

/// The FP4 (E2M1) code points.
const FP4: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Bytes of one of ggml's MXFP4 blocks (32 values).
pub const GGML_BLOCK_BYTES: usize = 17;

/// The values of ggml's MXFP4 blocks (`GGML_BLOCK_BYTES` each: the E8M0 scale, then 16 bytes
/// whose low nibbles are the block's values 0..16 and high nibbles its values 16..32), appended
/// to `out`. (Safetensors checkpoints pair the codes differently: [`dequantize`].)
pub fn dequantize_ggml(blocks: &[u8], out: &mut Vec<f32>) {
    for block in blocks.chunks_exact(GGML_BLOCK_BYTES) {
        let scale = 2f32.powi(i32::from(block[0]) - 127);
        let codes = &block[1..];
        let value = |code: u8| FP4[usize::from(code)] * scale;
        out.extend(codes.iter().map(|&b| value(b & 15)));
        out.extend(codes.iter().map(|&b| value(b >> 4)));
    }
}

/// Appends the values of `blocks` (16 bytes a block) scaled by their `scales` to `out`.
pub fn dequantize(blocks: &[u8], scales: &[u8], out: &mut Vec<f32>) {
    for (block, &scale) in blocks.chunks_exact(16).zip(scales) {
        let s = 2f32.powi(i32::from(scale) - 127);
        for &b in block {
            out.push(FP4[usize::from(b & 15)] * s);
            out.push(FP4[usize::from(b >> 4)] * s);
        }
    }
}

/// The stacked MXFP4 tensor `name` (`name_blocks` and `name_scales`) of `experts` matrices
/// `[rows, cols]`, one tensor per expert in the model dtype, when the weights are safetensors
/// that hold it; `None` otherwise.
pub fn experts(
    w: &Weights,
    name: &str,
    experts: usize,
    (rows, cols): (usize, usize),
) -> Result<Option<Vec<Tensor>>, ModelError> {
    let Weights::Safetensors {
        files,
        dtype,
        device,
    } = w
    else {
        return Ok(None);
    };
    let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
    let (Ok(blocks), Ok(scales)) = (files.get(&blocks_name), files.get(&scales_name)) else {
        return Ok(None);
    };
    let groups = cols / 32;
    if !cols.is_multiple_of(32)
        || blocks.shape() != [experts, rows, groups, 16]
        || scales.shape() != [experts, rows, groups]
    {
        return Err(ModelError::Config(format!(
            "MXFP4 {name}: blocks {:?} and scales {:?} for {experts} experts of [{rows}, {cols}]",
            blocks.shape(),
            scales.shape()
        )));
    }
    let (b, s) = (blocks.data(), scales.data());
    let (per_b, per_s) = (rows * groups * 16, rows * groups);
    (0..experts)
        .map(|e| {
            let mut values = Vec::with_capacity(rows * cols);
            dequantize(
                &b[e * per_b..(e + 1) * per_b],
                &s[e * per_s..(e + 1) * per_s],
                &mut values,
            );
            Ok(Tensor::from_vec(values, (rows, cols), &Device::Cpu)?
                .to_dtype(*dtype)?
                .to_device(device)?)
        })
        .collect::<Result<Vec<_>, ModelError>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_take_the_low_nibble_first_and_the_block_scale() {
        // Codes 1 (0.5) and 15 (-6) in the first byte, 7 (6) and 8 (-0) in the second.
        let mut block = [0u8; 16];
        block[0] = 0xF1;
        block[1] = 0x87;
        let mut out = Vec::new();
        dequantize(&block, &[127 + 2], &mut out); // scale 4
        assert_eq!(out.len(), 32);
        assert_eq!(&out[..4], &[2.0, -24.0, 24.0, -0.0]);
        assert!(out[4..].iter().all(|&x| x == 0.0));
        out.clear();
        dequantize(&[0x22; 16], &[127 - 3], &mut out); // code 2 (1.0) times 1/8
        assert!(out.iter().all(|&x| x == 0.125));
    }

    #[test]
    fn ggml_blocks_hold_the_low_nibbles_first_then_the_high_ones() {
        let mut block = [0u8; GGML_BLOCK_BYTES];
        block[0] = 127 + 1; // scale 2
        block[1] = 0xF1; // value 0: code 1 (0.5), value 16: code 15 (-6)
        block[16] = 0x72; // value 15: code 2 (1.0), value 31: code 7 (6)
        let mut out = Vec::new();
        dequantize_ggml(&block, &mut out);
        assert_eq!(out.len(), 32);
        assert_eq!((out[0], out[16], out[15], out[31]), (1.0, -12.0, 2.0, 12.0));
        assert!(out[1..15].iter().chain(&out[17..31]).all(|&x| x == 0.0));
    }
}
