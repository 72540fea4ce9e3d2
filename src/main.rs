//! The `pagewise` command line: a thin layer over the library.

use clap::Parser;

/// pagewise: an OpenAI-compatible LLM inference server with a paged KV cache and continuous batching.
///
/// The engine core (page table manager, scheduler, sampler, detokenizer) is in place; the `serve`
/// and `generate` subcommands arrive with the model and HTTP layers.
#[derive(Parser, Debug)]
#[command(name = "pagewise", version, about, long_about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    eprintln!(
        "pagewise {}: no subcommand yet; see README.md",
        env!("CARGO_PKG_VERSION")
    );
}
