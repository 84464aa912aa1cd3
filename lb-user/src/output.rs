//! How a one-shot command prints (`-o table|wide|json|yaml`, kubectl's names): one type for the command line
//! and for `trace`, which defines its own arguments.
use clap::ValueEnum;
use serde::Serialize;

/// How a one-shot command prints.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// The table with more columns where the command has them (as kubectl's `-o wide`; the same table
    /// where it has none).
    Wide,
    /// JSON.
    Json,
    /// YAML: the JSON's content.
    Yaml,
}

impl Output {
    /// `value` as JSON or YAML, or `table(wide)` for the table formats.
    pub fn render<T: Serialize>(
        self,
        value: &T,
        table: impl FnOnce(bool) -> String,
    ) -> anyhow::Result<String> {
        Ok(match self {
            Self::Table => table(false),
            Self::Wide => table(true),
            Self::Json => serde_json::to_string_pretty(value)? + "\n",
            Self::Yaml => yaml(value)?,
        })
    }

    /// A table format (`Table` or `Wide`).
    pub fn is_table(self) -> bool {
        matches!(self, Self::Table | Self::Wide)
    }
}

/// `value` as one YAML document.
pub fn yaml<T: Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(serde_saphyr::to_string(value)?)
}

/// An error and its causes on one line, each cause once: a cause whose text the line already holds (an error
/// that prints its source, as kube-rs's and `std::io`'s wrappers do) is not repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
