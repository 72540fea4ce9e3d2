//! 4-bit integer weights on the GPU (AWQ, GPTQ and compressed-tensors W4A16 checkpoints, repacked
//! at load): [`Int4Matrix`] (the codes in the decode GEMVs' order and their group scales and zero
//! points, one of the weights they stream, see [`crate::GemvWeight`]) and a weight's dequantized
//! copy for the steps that multiply on cuBLAS ([`int4_dequantize`]).

use std::ffi::c_void;

use candle_core::{DType, Result, Tensor, bail};

use crate::{check_launch, device_ptr, dtype_code, empty, ffi};

/// A 4-bit weight `[out, k]`: element `(o, c)` stands for `s * (q - z)`, `q` its code (0..15) and
/// `(s, z)` the f16 pair of row `o`'s group `c / group`.
#[derive(Clone, Copy, Debug)]
pub struct Int4Matrix<'a> {
    /// u8 `[out, k / 2]`: the codes, 8 a little-endian 32-bit word, in the order `layout` says.
    pub codes: &'a Tensor,
    /// f16 `[out, ceil(k / group), 2]`: each row's groups' (scale, zero point).
    pub scale_zero: &'a Tensor,
    /// Columns a group (`k` or more: one group a row).
    pub group: usize,
    /// The order of the codes.
    pub layout: Int4Layout,
}

/// How an [`Int4Matrix`]'s codes are ordered. In both, a 32-bit word holds 8 codes as 4 pairs of
/// neighbouring columns, pair `i` in nibbles `i` (the lower column) and `4 + i`, so that one mask
/// gives a pair as the halves of a 16-bit pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int4Layout {
    /// Row by row: word `j` of a row holds columns `8j..8j + 8`, columns `8j + 2i` and
    /// `8j + 2i + 1` as pair `i` (AutoAWQ's order). What the qkv GEMV with rotary
    /// ([`crate::gemv_rope_cache`]) reads.
    Rows,
    /// Tiles of 16 rows x 64 columns (512 bytes), row tiles in order and each one's column tiles
    /// in order, for the tensor-core GEMV (an m16n8k16 product a word): lane `l`'s 16 bytes of a
    /// tile start at `16 l`; its word `m` covers the tile's columns `16m..16m + 16` and holds, for
    /// `g = l / 4` and `t = l % 4`, the pairs starting at (row `g`, column `2t`), (`g + 8`, `2t`),
    /// (`g`, `2t + 8`), (`g + 8`, `2t + 8`) as pairs 0..3. Needs `out` a multiple of 16, `k` of
    /// 64, and groups of whole rows or a power of two of at least 64 columns
    /// ([`Int4Layout::tiles_fit`]).
    Tiles,
}

impl Int4Layout {
    /// Whether a `[out, k]` weight in groups of `group` columns can be laid out in tiles.
    pub fn tiles_fit((out, k): (usize, usize), group: usize) -> bool {
        out.is_multiple_of(16)
            && k.is_multiple_of(64)
            && k > 0
            && (group >= k || (group >= 64 && group.is_power_of_two()))
    }
}

impl Int4Matrix<'_> {
    /// `[out, k]`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        let (out, half) = self.codes.dims2()?;
        Ok((out, 2 * half))
    }

    /// That the parts agree: u8 codes, f16 pairs of the groups' shape, both contiguous.
    pub(crate) fn check(&self, what: &str) -> Result<(usize, usize)> {
        let (out, k) = self.dims()?;
        if self.codes.dtype() != DType::U8 || self.scale_zero.dtype() != DType::F16 {
            bail!(
                "{what}: 4-bit codes must be u8 and their scales f16, got {:?} and {:?}",
                self.codes.dtype(),
                self.scale_zero.dtype()
            );
        }
        if self.group == 0 || self.scale_zero.dims() != [out, k.div_ceil(self.group), 2] {
            bail!(
                "{what}: scales {:?} do not cover a [{out}, {k}] weight in groups of {}",
                self.scale_zero.dims(),
                self.group
            );
        }
        if !self.codes.is_contiguous() || !self.scale_zero.is_contiguous() {
            bail!("{what}: 4-bit codes and scales must be contiguous");
        }
        if self.layout == Int4Layout::Tiles && !Int4Layout::tiles_fit((out, k), self.group) {
            bail!(
                "{what}: a [{out}, {k}] weight in groups of {} cannot be laid out in tiles",
                self.group
            );
        }
        Ok((out, k))
    }
}

/// `m` with its scales and zero points applied, `[out, k]` in `dtype` (f16 or bf16): each
/// element `s * (q - z)` in f32, rounded once. What cuBLAS multiplies for the steps past the
/// GEMVs' rows. `k` must be a multiple of 8, the group a multiple of 8 or whole rows.
pub fn int4_dequantize(m: Int4Matrix<'_>, dtype: DType) -> Result<Tensor> {
    let (out, k) = m.check("int4_dequantize")?;
    if !k.is_multiple_of(8) || !(m.group.is_multiple_of(8) || m.group >= k) {
        bail!(
            "int4_dequantize: k {k} must be a multiple of 8 and the group {} whole rows or a \
             multiple of 8 columns",
            m.group
        );
    }
    let code = dtype_code(dtype, "int4_dequantize")?;
    if code == 0 {
        bail!("int4_dequantize: writes f16 or bf16, not f32");
    }
    let y = empty((out, k), dtype, m.codes.device())?;
    let (yp, stream) = device_ptr(&y, "out")?;
    let (wp, _) = device_ptr(m.codes, "codes")?;
    let (sp, _) = device_ptr(m.scale_zero, "scales")?;
    if wp % 4 != 0 || sp % 4 != 0 {
        bail!("int4_dequantize: codes and scales must start on 4-byte boundaries");
    }
    let int = |n: usize, what: &str| {
        i32::try_from(n).map_err(|_| {
            candle_core::Error::Msg(format!("int4_dequantize: {what} {n} is too large"))
        })
    };
    // SAFETY: checked shapes and dtypes on one device: the kernel reads out x k / 2 bytes of
    // codes and out x groups pairs, and writes out x k of y.
    let code = unsafe {
        ffi::pagewise_int4_dequantize(
            code,
            yp as *mut c_void,
            wp as *const c_void,
            sp as *const c_void,
            out as i64,
            int(k, "k")?,
            int(m.group.min(k), "group")?,
            i32::from(m.layout == Int4Layout::Tiles),
            stream,
        )
    };
    check_launch(code, "int4_dequantize")?;
    Ok(y)
}
