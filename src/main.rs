//! `quota-worker`: parse arguments, set up logging, call the library.

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use quota_worker::config::{HttpSettings, Settings};
use quota_worker::health::Health;
use quota_worker::reload::Reloader;
use quota_worker::status::Status;
use quota_worker::store::QuotaStore;
use quota_worker::worker::Worker;
use tokio_util::sync::CancellationToken;

/// jemalloc instead of the system allocator: a job's allocations (a task of about a
/// kilobyte, aligned; frames, buffers and replies) cost the worker a quarter of its
/// instructions in glibc's malloc (see BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Per-recipient caps and per-channel send rates for notification jobs on RabbitMQ and Redis.
#[derive(Parser, Debug)]
#[command(name = "quota-worker", version, about)]
struct Cli {
    /// Configuration file (TOML); environment variables QUOTA_WORKER__SECTION__KEY override it.
    #[arg(long, global = true, env = "QUOTA_WORKER_CONFIG")]
    config: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Auto)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    /// Human-readable on a terminal, JSON otherwise.
    Auto,
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the worker until SIGTERM or SIGINT (and serve /metrics, /healthz, /readyz).
    Run {
        /// Do not serve HTTP (same as http.enabled = false).
        #[arg(long)]
        no_http: bool,
    },
    /// Publish jobs: one from flags, or JSON lines from stdin; prints their ids.
    Publish(cli::publish::PublishArgs),
    /// Inspect and repair: queues, dead letters, recipients.
    Admin {
        #[command(subcommand)]
        command: cli::admin::AdminCommand,
    },
    /// Ask the running worker's /healthz (or --path) on http.listen; exit 0 when it
    /// answers 200. The image's HEALTHCHECK: no curl needed.
    Health {
        /// The path to ask (e.g. /readyz).
        #[arg(long, default_value = "/healthz")]
        path: String,
        /// Ask this address instead of http.listen.
        #[arg(long)]
        addr: Option<std::net::SocketAddr>,
    },
    /// Configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Write the command-line reference (cli.md, man/) into DIR (docs/reference).
    #[command(hide = true)]
    Reference { dir: PathBuf },
}

#[derive(Subcommand, Debug)]
enum ConfigCommand {
    /// Validate the configuration (TLS files included) and print the effective one,
    /// secrets redacted, with how each connection is made and any warnings.
    Check {
        /// Exit with status 2 when there is a warning (e.g. the built-in hash key).
        #[arg(long)]
        strict: bool,
    },
}

fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Reference { dir } = &cli.command {
        return match cli::reference::write(Cli::command(), dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(cli.log_format);
    quota_worker::tls::install_provider();
    let result = Settings::load(cli.config.as_deref())
        .map_err(anyhow::Error::from)
        .and_then(|settings| block_on(settings.worker.threads, dispatch(cli, settings)));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Run `main` on a runtime of `threads` threads (`worker.threads`).
fn block_on(
    threads: usize,
    main: impl std::future::Future<Output = anyhow::Result<ExitCode>> + Send + 'static,
) -> anyhow::Result<ExitCode> {
    if threads == 1 {
        // every task on this thread: a job's delivery, Redis reply and confirm wake
        // no other thread
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(main);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()?;
    // on a worker thread, not in `block_on`, so the tasks the consumer loop spawns
    // start on the thread that spawned them
    runtime.block_on(async {
        tokio::spawn(main)
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the main task failed: {e}")))
    })
}

async fn dispatch(cli: Cli, mut settings: Settings) -> anyhow::Result<ExitCode> {
    let path = cli.config.clone();
    match cli.command {
        Command::Config {
            command: ConfigCommand::Check { strict },
        } => {
            // comments, so the output stays a configuration file
            print!("{settings}");
            println!();
            for line in settings.connections() {
                println!("# {line}");
            }
            let warnings = settings.warnings();
            for w in &warnings {
                println!("# WARNING: {w}");
                eprintln!("warning: {w}");
            }
            Ok(match strict && !warnings.is_empty() {
                true => ExitCode::from(2),
                false => ExitCode::SUCCESS,
            })
        }
        Command::Run { no_http } => {
            settings.http.enabled &= !no_http;
            run(settings, path).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Health { path, addr } => health(&settings.http, &path, addr).await,
        Command::Publish(args) => cli::publish::publish(&settings, args).await,
        Command::Admin { command } => cli::admin::admin(&settings, command).await,
        Command::Reference { .. } => unreachable!("written before the configuration is read"),
    }
}

async fn health(
    http: &HttpSettings,
    path: &str,
    addr: Option<std::net::SocketAddr>,
) -> anyhow::Result<ExitCode> {
    let addr = match addr {
        Some(addr) => addr,
        None if !http.enabled => {
            anyhow::bail!("HTTP is off (http.enabled = false): there is nothing to ask")
        }
        None => quota_worker::http::local_address(&http.listen)?,
    };
    let timeout = std::time::Duration::from_secs(3);
    match quota_worker::http::probe(addr, path, timeout).await {
        Ok(200) => Ok(ExitCode::SUCCESS),
        Ok(code) => {
            eprintln!("unhealthy: {path} on {addr} answered {code}");
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!("unhealthy: {path} on {addr}: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

async fn run(settings: Settings, path: Option<PathBuf>) -> anyhow::Result<()> {
    for warning in settings.warnings() {
        tracing::warn!("{warning}");
    }
    quota_worker::telemetry::init(&settings.telemetry)
        .map_err(|e| anyhow::anyhow!("starting the trace export: {e}"))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(quota_worker::signals::on_terminate(shutdown.clone()));
    // served from the start: /healthz answers while Redis is awaited, /readyz says 503
    let health = Arc::new(Health::default());
    let status = Arc::new(Status::default());
    tokio::spawn(quota_worker::signals::on_hangup(
        status.clone(),
        shutdown.clone(),
    ));
    let http =
        quota_worker::http::start(&settings, health.clone(), status.clone(), shutdown.clone())
            .await?;
    let store = QuotaStore::connect_patiently(&settings, &shutdown)
        .await
        .with_context(|| {
            format!(
                "connecting to Redis at {}",
                quota_worker::config::redact_url(&settings.redis.url)
            )
        })?;
    let Some(store) = store else {
        tracing::info!("stopped before Redis was reachable");
        return Ok(());
    };
    let store = Arc::new(store);
    let reloader = Arc::new(Reloader::new(path, settings.clone(), store.clone()));
    status.attach(reloader);
    let worker = Worker::new(settings.clone(), store)
        .sharing_health(health)
        .sharing_status(status);
    let worker = Arc::new(worker);
    worker.run(shutdown.clone()).await?;
    shutdown.cancel();
    if let Some(http) = http {
        let _ = http.await;
    }
    quota_worker::telemetry::flush(std::time::Duration::from_secs(2)).await;
    tracing::info!("stopped");
    Ok(())
}
