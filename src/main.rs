//! The `pagewise` command line: a thin layer over the library.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use pagewise::Llm;
use pagewise::chat::ChatMessage;
use pagewise::cli::{Cli, Command, EngineFlags, GenerateCmd, LogFormat};
use pagewise::default_model::ensure_default_model;

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn resolve_model(flags: &EngineFlags) -> Result<String> {
    match &flags.model {
        Some(m) => Ok(m.clone()),
        None => Ok(ensure_default_model()
            .map_err(anyhow::Error::msg)?
            .to_string_lossy()
            .into_owned()),
    }
}

fn generate(cmd: GenerateCmd) -> Result<()> {
    let model = resolve_model(&cmd.engine)?;
    let mut llm = Llm::new(cmd.engine.to_engine_args(model.clone()))
        .with_context(|| format!("loading {model}"))?;
    let params = cmd.sampling_params();
    let start = Instant::now();
    let outputs = if cmd.chat {
        let conversations: Vec<Vec<ChatMessage>> = cmd
            .prompts
            .iter()
            .map(|p| vec![ChatMessage::new("user", p)])
            .collect();
        llm.chat(&conversations, &params)?
    } else {
        llm.generate(&cmd.prompts, &params)?
    };
    let elapsed = start.elapsed().as_secs_f64();
    let mut generated = 0;
    for (out, prompt) in outputs.iter().zip(&cmd.prompts) {
        for c in &out.outputs {
            generated += c.token_ids.len();
            println!("--- prompt: {prompt:?} (completion {})", c.index);
            println!("{}", c.text);
            let reason = c.finish_reason.map_or("none", |r| r.as_str());
            println!("--- finish_reason: {reason}, {} tokens", c.token_ids.len());
        }
    }
    eprintln!(
        "generated {generated} tokens in {elapsed:.2} s ({:.1} tokens/s, prefill included)",
        generated as f64 / elapsed
    );
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    match cli.command {
        Command::Generate(cmd) => generate(cmd),
    }
}
