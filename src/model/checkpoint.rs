//! A safetensors checkpoint (its shards memory-mapped) as the model reads it, with the loading's
//! progress logged for checkpoints large enough to wait for: one line at each tenth of the bytes
//! read, with the rate and the time left (`Progress`; a GGUF file's tensors report the same).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::safetensors::MmapedSafetensors;

/// Checkpoints from this size on log their loading's progress.
const LOGGED_FROM: u64 = 1 << 30;

/// The shards of a checkpoint.
pub struct Checkpoint {
    files: MmapedSafetensors,
    progress: Progress,
}

impl Checkpoint {
    /// The shards `paths`, memory-mapped.
    ///
    /// # Safety
    /// As [`MmapedSafetensors::multi`]: the files must not change while mapped.
    pub unsafe fn open(paths: &[PathBuf]) -> candle_core::Result<Self> {
        // SAFETY: the caller's promise.
        let files = unsafe { MmapedSafetensors::multi(paths) }?;
        let total = paths
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum();
        Ok(Checkpoint {
            files,
            progress: Progress::new(total),
        })
    }

    /// Tensor `name`, counted as read (once) toward the progress.
    pub fn get(&self, name: &str) -> candle_core::Result<safetensors::tensor::TensorView<'_>> {
        let view = self.files.get(name)?;
        if let Some(line) = self
            .progress
            .read(name, view.data().len() as u64, Instant::now())
        {
            tracing::info!("{line}");
        }
        Ok(view)
    }

    /// Tensor `name` on `device` in its stored dtype, counted as read.
    pub fn load(
        &self,
        name: &str,
        device: &candle_core::Device,
    ) -> candle_core::Result<candle_core::Tensor> {
        use candle_core::safetensors::Load;
        self.get(name)?.load(device)
    }

    /// Whether the checkpoint has tensor `name` (not counted as read).
    pub fn has(&self, name: &str) -> bool {
        self.files.get(name).is_ok()
    }
}

/// Bytes read of a checkpoint of `total` bytes (safetensors shards, or a GGUF file's tensors).
pub(crate) struct Progress {
    total: u64,
    started: Instant,
    state: Mutex<ProgressState>,
}

struct ProgressState {
    /// Tensors counted (a tied embedding is read twice, counted once).
    seen: HashSet<String>,
    read: u64,
    /// The tenths logged so far.
    tenths: u64,
}

impl Progress {
    /// Nothing read yet of `total` bytes.
    pub(crate) fn new(total: u64) -> Self {
        Progress {
            total,
            started: Instant::now(),
            state: Mutex::new(ProgressState {
                seen: HashSet::new(),
                read: 0,
                tenths: 0,
            }),
        }
    }

    /// Counts `bytes` of tensor `name` read at `now`; the line to log when that crosses a tenth
    /// of a checkpoint of at least [`LOGGED_FROM`] bytes.
    pub(crate) fn read(&self, name: &str, bytes: u64, now: Instant) -> Option<String> {
        if self.total < LOGGED_FROM {
            return None;
        }
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !s.seen.insert(name.to_string()) {
            return None;
        }
        s.read = (s.read + bytes).min(self.total);
        let tenths = s.read * 10 / self.total;
        if tenths <= s.tenths {
            return None;
        }
        s.tenths = tenths;
        let gb = |b: u64| b as f64 / 1e9;
        let secs = now
            .saturating_duration_since(self.started)
            .max(Duration::from_millis(1));
        let rate = s.read as f64 / secs.as_secs_f64();
        let left = (self.total - s.read) as f64 / rate;
        Some(format!(
            "loading weights: {}% ({:.1} of {:.1} GB, {:.2} GB/s, {:.0} s left)",
            tenths * 10,
            gb(s.read),
            gb(self.total),
            rate / 1e9,
            left
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_at_each_tenth_for_large_checkpoints_only() {
        let p = Progress::new(10 << 30);
        let at = |s: u64| p.started + Duration::from_secs(s);
        assert_eq!(p.read("a", 512 << 20, at(1)), None, "5%");
        let line = p.read("b", 1536 << 20, at(2)).expect("20%");
        assert_eq!(
            line,
            "loading weights: 20% (2.1 of 10.7 GB, 1.07 GB/s, 8 s left)"
        );
        assert_eq!(
            p.read("b", 1536 << 20, at(3)),
            None,
            "a tensor read again counts once"
        );
        let line = p.read("c", 8 << 30, at(10)).expect("100%");
        assert!(
            line.starts_with("loading weights: 100% (10.7 of 10.7 GB"),
            "{line}"
        );
        assert_eq!(p.read("d", 1 << 30, at(11)), None, "past the total");
        let small = Progress::new(LOGGED_FROM - 1);
        assert_eq!(small.read("a", LOGGED_FROM - 1, at(1)), None);
    }
}
