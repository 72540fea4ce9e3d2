//! The decode attention blocks' debug timeline (kernels/csrc/timeline.cuh), recorded only when the
//! kernels are built with `PAGEWISE_NVCC_FLAGS=-DPAGEWISE_DECODE_TIMELINE`: per block, when it
//! started and ended on the GPU's global clock and how many SM cycles it took to each stage.

use candle_core::Result;

use crate::{check_launch, ffi};

/// Slots in the timeline: split blocks first, merge blocks from `SPLIT_SLOTS` on.
const SLOTS: usize = 4096;
const SPLIT_SLOTS: usize = 3072;
const FIELDS: usize = 8;

/// One block of the last decode launch that wrote its slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockRecord {
    /// A split block (one of the attention kernel's) or a merge block.
    pub merge: bool,
    /// The block's index within its kernel's grid (x fastest).
    pub index: usize,
    /// The SM it ran on.
    pub sm: u32,
    /// The GPU's global clock (ns) at its start and end.
    pub start_ns: u64,
    pub end_ns: u64,
    /// SM cycles from its start to: the end of its wait for the kernel before it, its first K/V
    /// tile in shared memory (split blocks), the end of its tile loop (split blocks), its end.
    pub waited: u64,
    pub first_tile: u64,
    pub loop_end: u64,
    pub end: u64,
}

/// Reads the timeline (blocks with a record), then clears it when `reset`. `None` when the
/// kernels were built without the timeline.
pub fn decode_timeline(reset: bool) -> Result<Option<Vec<BlockRecord>>> {
    let mut raw = vec![0u64; SLOTS * FIELDS];
    // SAFETY: the callee writes at most `raw.len()` values.
    let err = unsafe {
        ffi::pagewise_decode_timeline(raw.as_mut_ptr(), raw.len() as i32, i32::from(reset))
    };
    if err == -1 {
        return Ok(None);
    }
    check_launch(err, "decode_timeline")?;
    let records = raw
        .chunks_exact(FIELDS)
        .enumerate()
        .filter(|(_, f)| f[7] != 0)
        .map(|(slot, f)| BlockRecord {
            merge: f[7] == 2,
            index: if slot >= SPLIT_SLOTS {
                slot - SPLIT_SLOTS
            } else {
                slot
            },
            sm: f[2] as u32,
            start_ns: f[0],
            end_ns: f[1],
            waited: f[3],
            first_tile: f[4],
            loop_end: f[5],
            end: f[6],
        })
        .collect();
    Ok(Some(records))
}
