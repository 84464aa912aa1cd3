//! The `tierlb` binary: parses the command line, sets up logging, and runs the agent (on a tokio runtime) or
//! a one-shot command, printing its output or the error chain.
use std::process::ExitCode;

use clap::Parser as _;
use tierlb::cli::{Cli, Command, LogFormat};

/// jemalloc, for the agent's memory (`tierlb::agent::memory` says why and what it measured).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The options jemalloc reads at its first allocation, by the symbol tikv-jemalloc-sys's prefixed build looks
/// for: a pointer to a NUL-terminated string.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &u8 = &tierlb::agent::memory::MALLOC_CONF[0];

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
    let argv = match tierlb::cli::expand_config(std::env::args_os().collect()) {
        Ok(argv) => argv,
        Err(e) => {
            eprintln!("tierlb: error: {e:#}");
            // A usage error, as clap's.
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(argv);
    init_logging(cli.log_format);
    if let Command::Agent(a) = &cli.command {
        a.tc_attach.set();
        a.xdp.set();
    }
    let result: anyhow::Result<Option<String>> = match &cli.command {
        Command::Agent(a) if a.cleanup => {
            let bpffs = a.bpffs.as_deref().expect("clap: --cleanup requires --bpffs");
            tierlb::cli::run_cleanup(bpffs, a.instance.as_deref().unwrap_or(&a.node.node)).map(Some)
        }
        Command::Agent(a) => {
            let opts = a.options();
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
            // Input it could not read whole wins over findings: the findings of what it did read are printed.
            Ok(out) => {
                print!("{}", out.text);
                return if out.errors > 0 {
                    ExitCode::from(tierlb::cli::EXIT_INVALID_INPUT)
                } else if out.findings > 0 {
                    ExitCode::from(tierlb::cli::EXIT_FINDINGS)
                } else {
                    ExitCode::SUCCESS
                };
            }
            Err(e) => {
                eprintln!("tierlb: error: {}", tierlb::cli::error_text(&e));
                return ExitCode::from(tierlb::cli::EXIT_INVALID_INPUT);
            }
        },
        Command::Preflight(p) => match tierlb::preflight::run(p) {
            Ok((text, ready)) => {
                print!("{text}");
                return if ready {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(tierlb::preflight::EXIT_NOT_READY)
                };
            }
            Err(e) => Err(e),
        },
        Command::Study(s) => tierlb::cli::run_study(s).map(Some),
        Command::Status(s) => tierlb::cli::run_status(s).map(Some),
        Command::Explain(e) => tierlb::cli::run_explain(e).map(Some),
        Command::Backend(b) => tierlb::cli::run_backend(b).map(Some),
        Command::Trace(t) => tierlb::trace::run(t).map(|()| None),
        Command::Completion(c) => Ok(Some(tierlb::cli::run_completion(c))),
        Command::Man(m) => tierlb::cli::run_man(m).map(Some),
    };
    match result {
        Ok(out) => {
            if let Some(out) = out {
                print!("{out}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tierlb: error: {}", tierlb::cli::error_text(&e));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use tierlb::agent::memory::jemalloc_value;

    #[test]
    fn the_binarys_jemalloc_runs_with_the_agents_options() {
        // `#[global_allocator]` above is what routes Rust's allocations to it; these are the options it runs
        // with (a conf it could not find or parse leaves jemalloc's defaults: 8 arenas on 2 CPUs, 10 s decay).
        assert_eq!(jemalloc_value::<u32>(c"opt.narenas"), Some(2), "MALLOC_CONF not read");
        assert_eq!(jemalloc_value::<bool>(c"opt.background_thread"), Some(true));
        assert_eq!(jemalloc_value::<isize>(c"opt.dirty_decay_ms"), Some(1_000));
        assert_eq!(jemalloc_value::<isize>(c"opt.muzzy_decay_ms"), Some(0));
        // And the heap is jemalloc's: what this test holds is in its statistics.
        let held = vec![1u8; 4 << 20];
        let h = tierlb::agent::memory::heap_stats().expect("jemalloc's statistics");
        assert!(h.allocated >= held.len() && h.resident >= h.allocated, "{h:?}");
    }
}
