//! The engine: requests, sequences, and turning sampled tokens into text.

pub mod args;
pub mod core;
pub mod detokenizer;
pub mod device;
mod engine_thread;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod handle;
pub mod kv_sizing;
pub mod loading;
pub mod snapshot;
// The plain request and sequence types live below the engine and the scheduler, which both use
// them; they are re-exported here under their old paths.
pub use crate::{request, sequence};
pub mod step_times;
pub mod stop;
mod text;
