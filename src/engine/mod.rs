//! The engine: loading a model, the engine thread and its handle, the step loop around the
//! scheduler and the runner, and turning sampled tokens into text. (The request and sequence
//! types it moves, `crate::request` and `crate::sequence`, live below it.)

pub mod args;
pub mod core;
pub mod detokenizer;
pub mod device;
mod draft;
mod eagle;
mod engine_thread;
#[cfg(feature = "fault-injection")]
pub mod faults;
pub mod handle;
mod kv_dtype;
pub mod kv_sizing;
pub mod loading;
mod propose;
mod proposer_cache;
pub mod replicas;
pub mod snapshot;
pub mod stop;
mod text;
pub mod worker;
