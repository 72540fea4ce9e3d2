//! A step's small inputs in one page-locked, device-mapped host buffer: the host writes plain
//! memory, and one kernel (capturable in a CUDA graph) copies each field into the fixed-address
//! tensors the step's kernels read. This replaces a copy call per input before every replay.

use std::ffi::c_int;

use candle_core::{Result, Tensor, bail};

use crate::pinned::MappedWords;
use crate::{check_launch, device_ptr, ffi};

/// Most fields one [`Staging::unpack`] copies.
pub const MAX_STAGED_FIELDS: usize = 12;

/// The kernel's view of a field (kernels/csrc/staging.cu `StagedField`).
#[repr(C)]
pub(crate) struct RawField {
    dst: *mut u32,
    src_word: c_int,
    rows: c_int,
    row_words: c_int,
    src_row_words: c_int,
    dst_row_words: c_int,
}

/// One field of the staging buffer and the tensor it lands in. Offsets and lengths count 32-bit
/// words (an i64 element is two, low word first).
pub struct StagedField<'a> {
    /// The destination: a contiguous CUDA tensor of 4- or 8-byte elements.
    pub dst: &'a Tensor,
    /// Where the field's first row starts in the staging buffer.
    pub src_word: usize,
    /// Rows copied.
    pub rows: usize,
    /// Words copied per row; `None`: as many as the staging buffer's word 0 says at run time
    /// (capped at `src_row_words`), for rows whose used width changes from step to step.
    pub row_words: Option<usize>,
    /// Distance between rows in the staging buffer.
    pub src_row_words: usize,
    /// Distance between rows in `dst`.
    pub dst_row_words: usize,
}

/// Page-locked host memory the GPU reads in place (mapped), `words` 32-bit words, zeroed.
pub struct Staging {
    mem: MappedWords,
}

impl Staging {
    /// Allocates the buffer in the CUDA context current on this thread (bind the device's context
    /// first: any kernel-crate call on its tensors does).
    pub fn new(words: usize) -> Result<Self> {
        Ok(Staging {
            mem: MappedWords::new(words, "Staging::new")?,
        })
    }

    /// The buffer, for the host to write a step's inputs. Only between steps: a kernel reading
    /// it must have finished (the caller synchronized), or it may see a mix of two steps.
    pub fn words_mut(&mut self) -> &mut [u32] {
        self.mem.as_mut_slice()
    }

    /// Enqueues the kernel that copies `fields` from this buffer into their tensors, on the
    /// first field's stream (all must share a device). It reads the buffer when it runs, so a
    /// CUDA graph that captured it picks up whatever the host wrote before each replay.
    pub fn unpack(&self, fields: &[StagedField<'_>]) -> Result<()> {
        if fields.is_empty() || fields.len() > MAX_STAGED_FIELDS {
            bail!(
                "unpack: 1 to {MAX_STAGED_FIELDS} fields, got {}",
                fields.len()
            );
        }
        let mut raw = Vec::with_capacity(fields.len());
        let mut stream = std::ptr::null_mut();
        for f in fields {
            let size = f.dst.dtype().size_in_bytes();
            if size != 4 && size != 8 {
                bail!("unpack: {:?} elements are not 4 or 8 bytes", f.dst.dtype());
            }
            let (ptr, s) = device_ptr(f.dst, "unpack")?;
            stream = s;
            let width = f.row_words.unwrap_or(f.src_row_words);
            let last_row = f.rows.saturating_sub(1);
            let src_end = f.src_word + last_row * f.src_row_words + width;
            let dst_end = last_row * f.dst_row_words + width;
            if f.rows > 0 && (src_end > self.mem.len() || dst_end > f.dst.elem_count() * size / 4) {
                bail!(
                    "unpack: {} rows of {width} words from word {} (stride {}) into {:?} \
                     (stride {}) do not fit ({} staged words)",
                    f.rows,
                    f.src_word,
                    f.src_row_words,
                    f.dst.dims(),
                    f.dst_row_words,
                    self.mem.len()
                );
            }
            let int = |x: usize| {
                c_int::try_from(x)
                    .map_err(|_| candle_core::Error::Msg(format!("unpack: {x} is too large")))
            };
            raw.push(RawField {
                dst: ptr as *mut u32,
                src_word: int(f.src_word)?,
                rows: int(f.rows)?,
                row_words: int(f.row_words.unwrap_or(0))?,
                src_row_words: int(f.src_row_words)?,
                dst_row_words: int(f.dst_row_words)?,
            });
        }
        // SAFETY: every field's source and destination ranges are checked above (a run-time
        // width is capped at `src_row_words` by the kernel); the buffer outlives this call, and
        // its owner keeps it alive while a graph that captured the launch exists.
        let code = unsafe {
            ffi::pagewise_unpack_staged(
                self.mem.device_ptr() as *const u32,
                raw.as_ptr(),
                raw.len() as c_int,
                stream,
            )
        };
        check_launch(code, "unpack")
    }
}
