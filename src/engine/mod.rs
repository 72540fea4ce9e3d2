//! The engine: requests, sequences, and turning sampled tokens into text.

pub mod args;
pub mod core;
pub mod detokenizer;
pub mod handle;
pub mod request;
pub mod sequence;
pub mod stop;
