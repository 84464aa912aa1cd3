//! Repository tooling: `cargo xtask setup | build | test | chaos | image | demo | bench | fuzz`, one module per
//! subcommand (an
//! `Options` struct and a `run` function each), plus `util` for running commands with the BPF build's
//! environment.
mod bench;
mod build;
mod chaos;
mod demo;
mod fuzz;
mod image;
mod k8s;
mod release;
mod setup;
mod test;
mod util;
mod vm;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "tierlb repository tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the build needs (idempotent): Debian packages, rust-src, bpf-linker, cargo-nextest.
    Setup(setup::Options),
    /// Build the tierlb binaries (release) with the embedded BPF object.
    Build(build::Options),
    /// Setup, format and lint checks, unit tests and in-kernel tests.
    Test(test::Options),
    /// The long chaos run: the agent SIGKILLed at random during 1,000 manifest edits while clients connect.
    Chaos(chaos::Options),
    /// Setup, then build the agent's container image (release, FROM scratch) as an OCI archive under
    /// target/image/, then unpack it and run its entrypoint in a chroot.
    Image(image::Options),
    /// Setup, build, and run the three-node demo in a private network namespace.
    Demo(demo::Options),
    /// Setup, build, and benchmark connect() through tierlb, iptables and nftables (see BENCHMARKS.md).
    Bench(bench::Options),
    /// Setup, then run the fuzz targets (cargo-fuzz, libFuzzer), each for --time seconds.
    Fuzz(fuzz::Options),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup(o) => setup::run(&o),
        Command::Build(o) => build::run(&o).map(|_| ()),
        Command::Test(o) => test::run(&o),
        Command::Chaos(o) => chaos::run(&o),
        Command::Image(o) => image::run(&o),
        Command::Demo(o) => demo::run(&o),
        Command::Bench(o) => bench::run(&o),
        Command::Fuzz(o) => setup::run(&setup::Options::default()).and_then(|()| fuzz::run(&o)),
    }
}
