//! The `pagewise` command line: a thin layer over the library.

use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;
use pagewise::Llm;
use pagewise::bench::{self, BenchCmd, BenchKind};
use pagewise::chat::ChatMessage;
use pagewise::cli::{Cli, ClientCmd, Command, GenerateCmd, LogFormat, ServeCmd};
use pagewise::client::{ClientSettings, Mode};
use pagewise::default_model::DEFAULT_MODEL_NAME;
use pagewise::default_model::ensure_default_model;
use pagewise::engine;
use pagewise::engine::handle::EngineHandle;
use pagewise::engine_flags::EngineFlags;
use pagewise::server::{self, AppState, ServerOptions};

/// Logs to stderr at `RUST_LOG`'s levels, else at `default`.
fn init_tracing(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
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
        None => Ok(ensure_default_model(flags.cache_dir.clone())
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

/// `pagewise chat` / `complete`: the terminal client against `--url`, or against a server on a
/// loopback port of this process serving the engine flags' model (stopped when the client ends).
fn client(cmd: ClientCmd, mode: Mode) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let mut settings = ClientSettings {
            url: cmd.url.clone().unwrap_or_default(),
            model_name: cmd.model_name.clone(),
            api_key: cmd.client_api_key.clone(),
            system_prompt: cmd.system_prompt.clone(),
            max_tokens: cmd.max_tokens,
            temperature: cmd.temperature,
        };
        let mut local = None;
        if cmd.url.is_none() {
            let model = resolve_model(&cmd.engine)?;
            let name = cmd
                .engine
                .model
                .clone()
                .unwrap_or(DEFAULT_MODEL_NAME.to_string());
            eprintln!("loading {model} (pass --url to talk to a running server instead)");
            let args = cmd.engine.to_engine_args(model.clone());
            let (engine, info) = tokio::task::spawn_blocking(move || EngineHandle::spawn(args, 0))
                .await?
                .with_context(|| format!("loading {model}"))?;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            settings.url = format!("http://{}/v1", listener.local_addr()?);
            let opts = ServerOptions {
                served_model_names: vec![name],
                ..Default::default()
            };
            let state = AppState::new(engine, info, &opts);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let until = async move {
                let _ = stopped.await;
            };
            let drain = std::time::Duration::from_secs(1);
            let server =
                tokio::spawn(
                    async move { server::serve(listener, state, &opts, until, drain).await },
                );
            local = Some((stop, server));
        }
        let mut input = std::io::stdin().lock();
        let result = pagewise::client::run(
            settings,
            mode,
            cmd.quick,
            &mut input,
            &mut std::io::stdout(),
        )
        .await;
        if let Some((stop, server)) = local {
            let _ = stop.send(());
            server.await??;
        }
        Ok(result?)
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

fn serve(cmd: ServeCmd) -> Result<()> {
    if cmd.headless && cmd.engine.parallel.node_rank == 0 {
        anyhow::bail!(
            "--headless is for the other nodes of a tensor-parallel group (--node-rank 1 or more); \
             node 0 runs the server"
        );
    }
    let named = cmd.model_arg.clone().or(cmd.engine.model.clone());
    let model = match &named {
        Some(m) => m.clone(),
        None => ensure_default_model(cmd.engine.cache_dir.clone())
            .map_err(anyhow::Error::msg)?
            .to_string_lossy()
            .into_owned(),
    };
    let names = if cmd.served_model_name.is_empty() {
        vec![named.unwrap_or_else(|| DEFAULT_MODEL_NAME.to_string())]
    } else {
        cmd.served_model_name.clone()
    };
    let opts = ServerOptions {
        served_model_names: names,
        api_keys: cmd.api_key.clone(),
        allowed_origins: cmd.allowed_origins.clone(),
        max_num_queued_requests: cmd.max_num_queued_requests,
        sse_keepalive: None,
        disable_dashboard: cmd.disable_dashboard,
        structured_limits: server::structured::StructuredLimits {
            max_bytes: cmd.structured_outputs_max_bytes,
            timeout: std::time::Duration::from_secs_f64(cmd.structured_outputs_timeout.max(0.0)),
        },
        tools: server::tools::ToolOptions {
            auto_tool_choice: cmd.enable_auto_tool_choice,
            parser: cmd.tool_call_parser,
        },
        reasoning_parser: reasoning_parser(&cmd)?,
        responses_store_size: Some(cmd.responses_store_size),
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", cmd.host, cmd.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AddrInUse => anyhow::anyhow!(
                    "port {} on {} is in use (another server?): stop it, or pick another \
                     port with --port",
                    cmd.port,
                    cmd.host
                ),
                _ => anyhow::Error::from(e).context(format!("binding {addr}")),
            })?;
        tracing::info!(
            "loading {model}; listening on http://{}",
            listener.local_addr()?
        );
        // While the model loads, a placeholder answers: /health 200, /ready and the rest 503.
        let (loaded_tx, loaded_rx) = tokio::sync::oneshot::channel::<()>();
        let socket = listener.into_std()?;
        let loading_listener = tokio::net::TcpListener::from_std(socket.try_clone()?)?;
        let loading = tokio::spawn(server::serve_loading(loading_listener, async move {
            let _ = loaded_rx.await;
        }));
        let args = cmd.engine.to_engine_args(model.clone());
        let (queue, replicas) = (cmd.max_num_queued_requests, cmd.data_parallel_size);
        let spawned =
            tokio::task::spawn_blocking(move || engine::replicas::spawn(&args, replicas, queue))
                .await?;
        let _ = loaded_tx.send(());
        loading.await??;
        let (engines, info) = spawned.with_context(|| format!("loading {model}"))?;
        let listener = tokio::net::TcpListener::from_std(socket)?;
        tracing::info!(
            "serving {} on http://{}",
            opts.served_model_names[0],
            listener.local_addr()?
        );
        let exits: Vec<_> = engines.replicas().iter().map(|e| e.exit()).collect();
        let state = AppState::new(engines, info, &opts);
        server::serve(
            listener,
            state,
            &opts,
            shutdown_signal(),
            std::time::Duration::from_secs(cmd.shutdown_timeout),
        )
        .await?;
        // Every handle is gone: the engine ends its last step and (under tensor parallelism)
        // stops the other ranks before the process exits.
        let waited = tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            exits.iter().all(|exit| {
                exit.wait(deadline.saturating_duration_since(std::time::Instant::now()))
            })
        });
        if !waited.await? {
            tracing::warn!("the engine did not stop within 10 s");
        }
        tracing::info!("stopped");
        Ok(())
    })
}

/// The reasoning parser to serve with: harmony tool calls (`--tool-call-parser openai`) are read
/// by harmony's reasoning split, so that parser implies `--reasoning-parser openai_gptoss`.
fn reasoning_parser(cmd: &ServeCmd) -> Result<Option<server::reasoning::ReasoningParser>> {
    use server::reasoning::ReasoningParser;
    match (cmd.tool_call_parser, cmd.reasoning_parser) {
        (Some(server::tools::ToolParser::Openai), None | Some(ReasoningParser::GptOss)) => {
            Ok(Some(ReasoningParser::GptOss))
        }
        (Some(server::tools::ToolParser::Openai), Some(other)) => anyhow::bail!(
            "--tool-call-parser openai reads gpt-oss's harmony format and needs \
             --reasoning-parser openai_gptoss (or none), not {other:?}"
        ),
        (_, parser) => Ok(parser),
    }
}

fn write_json(path: Option<&String>, value: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(value)?)
            .with_context(|| format!("writing {path}"))?;
    }
    Ok(())
}

fn bench(cmd: BenchCmd) -> Result<()> {
    match cmd.kind {
        BenchKind::Serve(a) => {
            let config = a.config()?;
            let result = tokio::runtime::Runtime::new()?
                .block_on(bench::serve::run(&config))
                .map_err(anyhow::Error::msg)?;
            println!("{}", result.report());
            if let Some(png) = &a.plot {
                bench::plot::load_font(a.plot_font.as_deref()).map_err(anyhow::Error::msg)?;
                bench::plot::percentiles_chart(&result, png).map_err(anyhow::Error::msg)?;
                println!("chart: {}", png.display());
            }
            write_json(a.result_file.as_ref(), &result)?;
            if result.completed == 0 && result.failed > 0 {
                anyhow::bail!(
                    "every request failed; the first: {}",
                    result.first_error.as_deref().unwrap_or("no message")
                );
            }
            Ok(())
        }
        BenchKind::Plot(a) => {
            let results = a
                .results
                .iter()
                .map(|p| {
                    let text = std::fs::read_to_string(p)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
                    serde_json::from_str(&text).map_err(|e| {
                        anyhow::anyhow!("{}: not a `bench serve` result: {e}", p.display())
                    })
                })
                .collect::<Result<Vec<bench::serve::ServeBenchResult>>>()?;
            bench::plot::load_font(a.plot_font.as_deref()).map_err(anyhow::Error::msg)?;
            bench::plot::rate_sweep_chart(&results, &a.out).map_err(anyhow::Error::msg)?;
            println!("chart: {}", a.out.display());
            Ok(())
        }
        BenchKind::Throughput(a) => {
            let model = resolve_model(&a.engine)?;
            let schema = match &a.json_schema {
                Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
                None => bench::offline::default_bench_schema(),
            };
            let r = bench::offline::throughput(
                a.engine.to_engine_args(model),
                a.num_prompts,
                a.input_len,
                a.output_len,
                (a.json_schema_fraction.clamp(0.0, 1.0), schema),
            )?;
            println!(
                "{} prompts in {:.2} s: {:.2} req/s, {:.1} total tok/s, {:.1} output tok/s",
                r.num_prompts,
                r.elapsed_s,
                r.requests_per_s,
                r.total_tokens_per_s,
                r.output_tokens_per_s
            );
            println!("{}", r.step_breakdown.row());
            write_json(a.output_json.as_ref(), &r)
        }
        BenchKind::Latency(a) => {
            let model = resolve_model(&a.engine)?;
            let args = a.engine.to_engine_args(model);
            let r = bench::offline::latency(args, &a.workload())?;
            println!("batch {}: {}", r.batch_size, r.latency.row("latency"));
            println!("batch {}: {}", r.batch_size, r.ttft.row("first token"));
            println!(
                "{:.1} output tok/s per sequence; prefill {:.1} tok/s, decode alone {:.1} tok/s per sequence",
                r.decode_tokens_per_s_per_seq,
                r.prefill_tokens_per_s,
                r.decode_only_tokens_per_s_per_seq
            );
            if let Some(s) = &r.speculative {
                println!(
                    "speculative: {} of {} draft tokens accepted ({:.1}%), {:.2} tokens per step",
                    s.accepted_tokens,
                    s.draft_tokens,
                    100.0 * s.acceptance_rate,
                    s.tokens_per_step
                );
            }
            println!("{}", r.step_breakdown.row());
            write_json(a.output_json.as_ref(), &r)
        }
    }
}

/// Applies `--config FILE` as PAGEWISE_* variables that the environment does not already set.
fn apply_config_file() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = pagewise::config_file::config_path(&args) else {
        return Ok(());
    };
    let mut known = std::collections::HashSet::new();
    flag_variables(&<Cli as clap::CommandFactory>::command(), &mut known);
    for (var, value) in pagewise::config_file::read(&path, |v| known.contains(v))? {
        if std::env::var_os(&var).is_none() {
            // SAFETY: called first thing in main, before any other thread exists.
            unsafe { std::env::set_var(var, value) };
        }
    }
    Ok(())
}

/// The environment variables the flags of `cmd` and its subcommands read.
fn flag_variables(cmd: &clap::Command, out: &mut std::collections::HashSet<String>) {
    for arg in cmd.get_arguments() {
        if let Some(var) = arg.get_env() {
            out.insert(var.to_string_lossy().into_owned());
        }
    }
    for sub in cmd.get_subcommands() {
        flag_variables(sub, out);
    }
}

/// The engine flags of a command that loads a model.
fn engine_flags(command: &Command) -> Option<&EngineFlags> {
    match command {
        Command::Serve(c) => Some(&c.engine),
        Command::Generate(c) => Some(&c.engine),
        Command::Bench(c) => match &c.kind {
            BenchKind::Throughput(a) => Some(&a.engine),
            BenchKind::Latency(a) => Some(&a.engine),
            BenchKind::Serve(_) | BenchKind::Plot(_) => None,
        },
        Command::Chat(c) | Command::Complete(c) => c.url.is_none().then_some(&c.engine),
    }
}

/// Runs this process as a tensor-parallel worker rank (any rank but 0) until rank 0 stops.
fn tp_worker(flags: &EngineFlags, model_arg: Option<String>) -> Result<()> {
    let model = match model_arg {
        Some(m) => m,
        None => resolve_model(flags)?,
    };
    let args = flags.to_engine_args(model);
    let rank = args.parallel.rank();
    pagewise::engine::worker::run(&args)
        .with_context(|| format!("tensor-parallel rank {} of {}", rank.rank, rank.size))
}

/// Settles the CPU thread count in `RAYON_NUM_THREADS` (when the environment does not set it) to
/// what candle would pick: candle reads it for every CPU matmul, and without it re-detects the
/// physical cores by parsing /proc/cpuinfo each time, about a fifth of a CPU decode step
/// (benches/RESULTS.md).
///
/// Also shortens how long candle's own workers spin after each elementwise op before they sleep
/// (`CANDLE_BARRIER_POOL_SPIN_LIMIT`, 25,000 pauses by default, about half a millisecond), unless
/// the environment sets it: the matmuls run on our team (`pagewise_cpu::team`), and a candle
/// worker spinning beside it took 8% of a Gemma-3-270M prefill's CPU time on 2 cores. With 200
/// pauses, prefill of the small models ran 8-20% faster on the Zen 4 VM, decode alike.
fn settle_cpu_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = candle_core::utils::get_num_threads();
        // SAFETY: called first thing in main, before any other thread exists.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", "200") };
    }
}

/// Runs the command; a failure is one line on stderr (the error and its causes, which name the
/// fix) and exit status 1.
fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    settle_cpu_threads();
    apply_config_file()?;
    let cli = Cli::parse();
    if let Some(n) = engine_flags(&cli.command).and_then(|f| f.cpu_threads) {
        // SAFETY: still before any other thread exists (parsing and the config file spawn none).
        unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    }
    // (The terminal clients keep the engine's progress lines out of the conversation.)
    let level = match cli.command {
        Command::Chat(_) | Command::Complete(_) => "warn",
        _ => "info",
    };
    init_tracing(cli.log_format, level);
    if let Some(flags) = engine_flags(&cli.command)
        && flags.parallel.to_config().rank().rank != 0
    {
        let model_arg = match &cli.command {
            Command::Serve(c) => c.model_arg.clone().or(flags.model.clone()),
            _ => flags.model.clone(),
        };
        return tp_worker(flags, model_arg);
    }
    match cli.command {
        Command::Serve(cmd) => serve(cmd),
        Command::Generate(cmd) => generate(cmd),
        Command::Bench(cmd) => bench(cmd),
        Command::Chat(cmd) => client(cmd, Mode::Chat),
        Command::Complete(cmd) => client(cmd, Mode::Complete),
    }
}
