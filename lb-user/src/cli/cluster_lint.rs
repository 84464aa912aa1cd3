//! `tierlb lint`: every Service of a source judged across the cluster (`lint::cluster_lint`), one line per
//! finding with the Service, the rule, the nodes it concerns and the fix; exit status 0 clean, 1 findings, 2
//! usage, 3 input it could not read whole (an unreadable source, an invalid object or document, no Service).
use std::fmt::Write as _;

use crate::{lint, output::Output};

/// `tierlb lint`.
#[derive(clap::Args, Debug)]
pub struct LintArgs {
    /// Where the objects come from (with --namespace, every node the source names is still judged).
    #[command(flatten)]
    pub source: super::FaceSource,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `tierlb lint`'s exit status when it found something (for CI); 0 when clean, 2 for usage errors.
pub const EXIT_FINDINGS: u8 = 1;

/// What `tierlb lint` prints, and how many findings.
pub struct LintOutput {
    /// The lines or JSON.
    pub text: String,
    /// Findings (0: clean).
    pub findings: usize,
    /// Error diagnostics (printed to stderr already): objects, documents or files not judged. A gate that
    /// passed a manifest it could not read would pass a broken one: the status is then `EXIT_INVALID_INPUT`.
    pub errors: usize,
}

/// `tierlb lint`: the findings of every Service of the source (of `--namespace`).
pub fn run_lint(args: &LintArgs) -> anyhow::Result<LintOutput> {
    lint_on(args, &args.source.load(None)?)
}

/// `tierlb lint` of an input already read.
pub fn lint_on(args: &LintArgs, input: &super::CliInput) -> anyhow::Result<LintOutput> {
    anyhow::ensure!(
        !input.model.services.is_empty() || input.errors > 0,
        "no Service in {}: nothing to judge (a lint that finds nothing to read must not pass; check the path \
         or --namespace)",
        input.origin
    );
    let nodes = lint::cluster_nodes(&input.model);
    let mut found = lint::cluster_lint(&input.model, &nodes, &input.filled, &input.pods);
    found.extend(unknown_field_findings(&input.unknown_fields, &nodes));
    found.sort_by(|a, b| a.service.cmp(&b.service).then(a.port.cmp(&b.port)));
    let text = args.output.render(&found, |wide| table(&found, nodes.len(), wide, input.errors))?;
    Ok(LintOutput { text, findings: found.len(), errors: input.errors })
}

/// One line per finding; `wide` names every node, where the table says `all N nodes`. With `errors` (input
/// not read whole, on stderr already) an empty list is not "no findings": it says what was not judged.
fn table(found: &[lint::ClusterFinding], nodes: usize, wide: bool, errors: usize) -> String {
    let mut out = String::new();
    for f in found {
        let port = if f.port.is_empty() { String::new() } else { format!(" port {}", f.port) };
        let on = if f.all_nodes && !wide { format!("all {nodes} nodes") } else { f.nodes.join(",") };
        let _ = writeln!(out, "{}{port}: {} [{on}]: {}; fix: {}", f.service, f.rule, f.message, f.fix);
    }
    if errors > 0 {
        let _ = writeln!(
            out,
            "{} in what could be read ({nodes} nodes); {errors} error(s) above: not judged (exit status 3)",
            if found.is_empty() { "nothing found".to_owned() } else { format!("{} finding(s)", found.len()) }
        );
    } else if found.is_empty() {
        let _ = writeln!(out, "no findings ({nodes} nodes)");
    }
    out
}

/// A finding for each unknown field (`Diagnostic::is_unknown_field`) of a Service or its slices in
/// `unknown`: where it is (file, line, document, field), the field it is likely a misspelling of; it holds
/// on every node of `nodes`.
fn unknown_field_findings(
    unknown: &[crate::source::Diagnostic],
    nodes: &[crate::model::NodeInfo],
) -> Vec<lint::ClusterFinding> {
    unknown
        .iter()
        .filter_map(|d| {
            Some(lint::ClusterFinding {
                service: d.service.clone()?,
                port: String::new(),
                rule: lint::Rule::UnknownField,
                message: d.to_string(),
                fix: lint::Rule::UnknownField.fix(),
                nodes: nodes.iter().map(|n| n.name.clone()).collect(),
                all_nodes: true,
            })
        })
        .collect()
}
