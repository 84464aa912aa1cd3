//! The `tierlb` binary: parses the command line, sets up logging, and runs the agent (on a tokio runtime) or
//! a one-shot command, printing its output or the error chain.
use std::process::ExitCode;

use clap::Parser as _;
use tierlb::cli::{Cli, Command, LogFormat};

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result: anyhow::Result<Option<String>> = match &cli.command {
        Command::Agent(a) if a.cleanup => {
            let bpffs = a.bpffs.as_deref().expect("clap: --cleanup requires --bpffs");
            tierlb::cli::run_cleanup(bpffs, a.instance.as_deref().unwrap_or(&a.node.node)).map(Some)
        }
        Command::Agent(a) => {
            let opts = a.options();
            tierlb::agent::memory::limit_arenas();
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(tierlb::agent::run(opts)))
                .map(|()| None)
        }
        Command::Plan(p) => match tierlb::cli::run_plan(p) {
            // The plan of the valid objects is printed also when some are invalid; the status says so.
            Ok(out) if out.errors > 0 => {
                print!("{}", out.text);
                return ExitCode::from(tierlb::cli::EXIT_INVALID_INPUT);
            }
            r => r.map(|out| Some(out.text)),
        },
        Command::Lint(l) => match tierlb::cli::run_lint(l) {
            Ok(out) => {
                print!("{}", out.text);
                return if out.findings > 0 {
                    ExitCode::from(tierlb::cli::EXIT_FINDINGS)
                } else {
                    ExitCode::SUCCESS
                };
            }
            Err(e) => Err(e),
        },
        Command::Study(s) => tierlb::cli::run_study(s).map(Some),
        Command::Status(s) => tierlb::cli::run_status(s).map(Some),
        Command::Explain(e) => tierlb::cli::run_explain(e).map(Some),
        Command::Backend(b) => tierlb::cli::run_backend(b).map(Some),
        Command::Trace(t) => tierlb::trace::run(t).map(|()| None),
    };
    match result {
        Ok(out) => {
            if let Some(out) = out {
                print!("{out}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tierlb: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
