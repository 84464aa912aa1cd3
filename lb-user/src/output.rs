//! How a one-shot command prints (`-o table|json`): one type for the command line and for `trace`, which
//! defines its own arguments.
use clap::ValueEnum;

/// How a one-shot command prints.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// JSON.
    Json,
}
