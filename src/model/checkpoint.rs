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

    /// Each of `layers` layers' FP8 KV-cache scales `(k, v)`, where the checkpoint has them
    /// (llm-compressor's `model.layers.{i}.self_attn.k_scale` / `v_scale`, or the older
    /// `k_proj.output_scale` / `v_proj.output_scale`); `None` where no layer has one. An error
    /// names a layer without them when others have them, and a scale that is not one positive,
    /// finite number.
    pub fn kv_scales(&self, layers: usize) -> Result<Option<Vec<(f32, f32)>>, String> {
        let scale = |i: usize, which: char| -> Result<Option<f32>, String> {
            let names = [
                format!("model.layers.{i}.self_attn.{which}_scale"),
                format!("model.layers.{i}.self_attn.{which}_proj.output_scale"),
            ];
            let Some(name) = names.iter().find(|n| self.has(n)) else {
                return Ok(None);
            };
            let t: Vec<f32> = self
                .load(name, &candle_core::Device::Cpu)
                .and_then(|t| {
                    t.to_dtype(candle_core::DType::F32)?
                        .flatten_all()?
                        .to_vec1()
                })
                .map_err(|e| format!("{name}: {e}"))?;
            match t[..] {
                [s] if s.is_finite() && s > 0.0 => Ok(Some(s)),
                _ => Err(format!("{name} must be one positive number, got {t:?}")),
            }
        };
        let mut found = Vec::with_capacity(layers);
        for i in 0..layers {
            found.push((scale(i, 'k')?, scale(i, 'v')?));
        }
        if found.iter().all(|&(k, v)| k.is_none() && v.is_none()) {
            return Ok(None);
        }
        found
            .into_iter()
            .enumerate()
            .map(|(i, pair)| match pair {
                (Some(k), Some(v)) => Ok((k, v)),
                _ => Err(format!(
                    "the checkpoint has KV-cache scales (k_scale / v_scale) for some layers \
                     but not both for layer {i}"
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// Bytes done of a `total`, told as a line at each tenth: "`what`: 20% (2.1 of 10.7 GB, 1.07
/// GB/s, 8 s left)" (MB below a gigabyte). Loading progress ([`Progress`]) and downloads from the hub
/// (`loader::hub`) count with it.
pub(crate) struct Tenths {
    what: String,
    total: u64,
    started: Instant,
    done: u64,
    /// The tenths told so far.
    told: u64,
}

impl Tenths {
    /// Nothing done yet of `total` bytes, from `started`.
    pub(crate) fn new(what: impl Into<String>, total: u64, started: Instant) -> Self {
        Tenths {
            what: what.into(),
            total,
            started,
            done: 0,
            told: 0,
        }
    }

    /// Counts `bytes` more done at `now`; the line to tell when that crosses a tenth.
    pub(crate) fn add(&mut self, bytes: u64, now: Instant) -> Option<String> {
        if self.total == 0 {
            return None;
        }
        self.done = (self.done + bytes).min(self.total);
        let tenths = self.done * 10 / self.total;
        if tenths <= self.told {
            return None;
        }
        self.told = tenths;
        let secs = now
            .saturating_duration_since(self.started)
            .max(Duration::from_millis(1));
        let rate = self.done as f64 / secs.as_secs_f64();
        let left = (self.total - self.done) as f64 / rate;
        // GB from a gigabyte on, else MB.
        let (done, total) = if self.total >= 1_000_000_000 {
            let gb = |b: u64| b as f64 / 1e9;
            (
                format!("{:.1}", gb(self.done)),
                format!("{:.1} GB", gb(self.total)),
            )
        } else {
            let mb = |b: u64| b as f64 / 1e6;
            (
                format!("{:.0}", mb(self.done)),
                format!("{:.0} MB", mb(self.total)),
            )
        };
        Some(format!(
            "{}: {}% ({done} of {total}, {:.2} GB/s, {left:.0} s left)",
            self.what,
            tenths * 10,
            rate / 1e9,
        ))
    }
}

/// Bytes read of a checkpoint of `total` bytes (safetensors shards, or a GGUF file's tensors).
pub(crate) struct Progress {
    state: Mutex<ProgressState>,
}

struct ProgressState {
    /// Tensors counted (a tied embedding is read twice, counted once).
    seen: HashSet<String>,
    /// `None` below [`LOGGED_FROM`] bytes.
    tenths: Option<Tenths>,
}

impl Progress {
    /// Nothing read yet of `total` bytes.
    pub(crate) fn new(total: u64) -> Self {
        Progress {
            state: Mutex::new(ProgressState {
                seen: HashSet::new(),
                tenths: (total >= LOGGED_FROM)
                    .then(|| Tenths::new("loading weights", total, Instant::now())),
            }),
        }
    }

    /// Counts `bytes` of tensor `name` read at `now`; the line to log when that crosses a tenth
    /// of a checkpoint of at least [`LOGGED_FROM`] bytes.
    pub(crate) fn read(&self, name: &str, bytes: u64, now: Instant) -> Option<String> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.tenths.as_ref()?;
        if !s.seen.insert(name.to_string()) {
            return None;
        }
        s.tenths.as_mut()?.add(bytes, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_at_each_tenth() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut t = Tenths::new("loading weights", 10 << 30, t0);
        assert_eq!(t.add(512 << 20, at(1)), None, "5%");
        assert_eq!(
            t.add(1536 << 20, at(2)).expect("20%"),
            "loading weights: 20% (2.1 of 10.7 GB, 1.07 GB/s, 8 s left)"
        );
        let line = t.add(8 << 30, at(10)).expect("100%");
        assert!(
            line.starts_with("loading weights: 100% (10.7 of 10.7 GB"),
            "{line}"
        );
        assert_eq!(t.add(1 << 30, at(11)), None, "past the total");
        assert_eq!(Tenths::new("nothing", 0, t0).add(1, at(1)), None);
        let mut small = Tenths::new("downloading f", 70_000_000, t0);
        assert_eq!(
            small.add(35_000_000, at(1)).expect("50%"),
            "downloading f: 50% (35 of 70 MB, 0.04 GB/s, 1 s left)"
        );
    }

    #[test]
    fn large_checkpoints_count_each_tensor_once() {
        let p = Progress::new(10 << 30);
        let now = Instant::now();
        assert_eq!(p.read("a", 512 << 20, now), None, "5%");
        assert!(p.read("b", 1536 << 20, now).is_some(), "20%");
        assert_eq!(
            p.read("b", 1536 << 20, now),
            None,
            "a tensor read again counts once"
        );
        let small = Progress::new(LOGGED_FROM - 1);
        assert_eq!(small.read("a", LOGGED_FROM - 1, now), None);
    }

    /// A checkpoint of `tensors` (name, value) in a fresh file.
    fn checkpoint(tag: &str, tensors: &[(&str, f32)]) -> Checkpoint {
        use candle_core::{Device, Tensor};
        let dir = std::env::temp_dir().join(format!("pagewise-kv-scales-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{tag}.safetensors"));
        let mut map: std::collections::HashMap<String, Tensor> = tensors
            .iter()
            .map(|&(n, v)| (n.to_string(), Tensor::new(v, &Device::Cpu).unwrap()))
            .collect();
        map.insert(
            "model.norm.weight".into(),
            Tensor::ones(4, candle_core::DType::F32, &Device::Cpu).unwrap(),
        );
        candle_core::safetensors::save(&map, &path).unwrap();
        // SAFETY: the test's own file, not written again.
        unsafe { Checkpoint::open(&[path]) }.unwrap()
    }

    #[test]
    fn kv_scales_are_read_per_layer_or_refused_by_name() {
        let none = checkpoint("none", &[]);
        assert_eq!(none.kv_scales(2).unwrap(), None);
        let both = checkpoint(
            "both",
            &[
                ("model.layers.0.self_attn.k_scale", 0.5),
                ("model.layers.0.self_attn.v_scale", 0.25),
                ("model.layers.1.self_attn.k_proj.output_scale", 2.0),
                ("model.layers.1.self_attn.v_proj.output_scale", 4.0),
            ],
        );
        assert_eq!(
            both.kv_scales(2).unwrap(),
            Some(vec![(0.5, 0.25), (2.0, 4.0)])
        );
        let partial = checkpoint(
            "partial",
            &[
                ("model.layers.0.self_attn.k_scale", 0.5),
                ("model.layers.0.self_attn.v_scale", 0.25),
                ("model.layers.1.self_attn.k_scale", 0.5),
            ],
        );
        let e = partial.kv_scales(2).unwrap_err();
        assert!(e.contains("not both for layer 1"), "{e}");
        let negative = checkpoint(
            "negative",
            &[
                ("model.layers.0.self_attn.k_scale", -1.0),
                ("model.layers.0.self_attn.v_scale", 1.0),
            ],
        );
        let e = negative.kv_scales(1).unwrap_err();
        assert!(
            e.contains("model.layers.0.self_attn.k_scale must be one positive number"),
            "{e}"
        );
    }
}
