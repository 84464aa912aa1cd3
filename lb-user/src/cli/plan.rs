//! `tierlb plan` and `tierlb explain`: which endpoints each Service port uses on a node, as a table (contested
//! VIP:ports marked) or JSON, and one Service explained in words.
use super::{
    FaceSource, NodeSite,
    table::{TableNotes, all_nodes_table, plan_table},
};
use crate::{
    datapath::pins,
    lint,
    output::Output,
    plan::{self, Plan},
};

/// `tierlb plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The node to plan for (matches EndpointSlice `nodeName` and `hints.forNodes`).
    #[arg(long, visible_alias = "hostname-override", required_unless_present = "all_nodes")]
    pub node: Option<String>,
    /// Plan every node the source names (its Node objects and the nodes its endpoints name), one table with
    /// a NODE column (JSON and YAML: one plan per node).
    #[arg(long, conflicts_with_all = ["node", "zone"])]
    pub all_nodes: bool,
    /// The node's zone and addresses.
    #[command(flatten)]
    pub site: NodeSite,
    /// Where the objects come from.
    #[command(flatten)]
    pub source: FaceSource,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// `tierlb explain`.
#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    /// The Service: NAMESPACE/NAME, or NAME in --namespace (default: namespace "default", as kubectl). With
    /// --kube, only its namespace is read.
    #[arg(value_name = "SERVICE")]
    pub service: String,
    /// The node to explain for (matches EndpointSlice `nodeName` and `hints.forNodes`).
    #[arg(long, visible_alias = "hostname-override", required_unless_present = "all_nodes")]
    pub node: Option<String>,
    /// Explain it on every node the source names (its Node objects and the nodes its endpoints name), one
    /// explanation after the other (JSON and YAML: one plan per node).
    #[arg(long, conflicts_with_all = ["node", "zone"])]
    pub all_nodes: bool,
    /// The node's zone and addresses.
    #[command(flatten)]
    pub site: NodeSite,
    /// Where the objects come from.
    #[command(flatten)]
    pub source: FaceSource,
    /// Also name the Service's backends the running agents' passive health follows (held down, half-open or
    /// failing) or that are marked down, read from the maps pinned under this directory.
    #[arg(long)]
    pub bpffs: Option<std::path::PathBuf>,
    /// With --bpffs: only this agent instance (default: every instance under --bpffs).
    #[arg(long, requires = "bpffs")]
    pub instance: Option<String>,
    /// Output format: the explanation in words (table, wide), or the Service's port plans with their
    /// warnings (json, yaml; as `plan -o json` has them).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

impl ExplainArgs {
    /// The Service: `NAMESPACE/NAME`, or `NAME` in `--namespace` (else "default").
    pub fn key(&self) -> anyhow::Result<crate::model::ObjKey> {
        let ns = self.source.namespace.as_deref();
        if !self.service.contains('/') {
            anyhow::ensure!(!self.service.is_empty(), "give the Service as NAME or NAMESPACE/NAME");
            return Ok(crate::model::ObjKey::new(ns.unwrap_or("default"), self.service.as_str()));
        }
        let key: crate::model::ObjKey = self.service.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        if let Some(ns) = ns.filter(|ns| *ns != &*key.namespace) {
            anyhow::bail!(
                "--namespace {ns} does not hold Service {key}: give NAME with --namespace, or NAMESPACE/NAME alone"
            );
        }
        Ok(key)
    }
}

/// `tierlb explain`: the explanation text.
pub fn run_explain(args: &ExplainArgs) -> anyhow::Result<String> {
    let key = args.key()?;
    let input = args.source.load_about(Some(&key.namespace), Some(&key))?;
    explain_on(args, &input)
}

/// `tierlb explain` of an input already read.
pub fn explain_on(args: &ExplainArgs, input: &super::CliInput) -> anyhow::Result<String> {
    let key = args.key()?;
    let names: Vec<String> = match &args.node {
        Some(n) => vec![n.clone()],
        None => lint::cluster_nodes(&input.model).into_iter().map(|n| n.name).collect(),
    };
    anyhow::ensure!(
        !names.is_empty(),
        "--all-nodes: {} names no node (no Node object, no endpoint's nodeName): give --node NAME",
        input.origin
    );
    let nodes: Vec<_> = names.iter().map(|n| input.node_named(n, &args.site)).collect();
    let missing = || {
        anyhow::anyhow!(
            "no Service {key} in {} (a manifest without metadata.namespace is in namespace \"default\")",
            input.origin
        )
    };
    if !args.output.is_table() {
        if !input.model.services.contains_key(&key) && !input.model.skipped.contains_key(&key) {
            return Err(missing());
        }
        let plans: Vec<Plan> = nodes.iter().map(|n| plan::plan(&input.model, n)).collect();
        let lints: Vec<lint::Lints> = plans
            .iter()
            .zip(&nodes)
            .map(|(p, n)| lint::lint_naming(&input.model, n, p, &input.pods))
            .collect();
        let linted: Vec<lint::LintedPlan<'_>> = plans
            .iter()
            .zip(&lints)
            .map(|(p, l)| lint::LintedPlan::new(p, l).emulated(&input.filled).only(&key))
            .collect();
        return if args.all_nodes {
            args.output.render(&linted, |_| String::new())
        } else {
            args.output.render(&linted[0], |_| String::new())
        };
    }
    let mut texts = Vec::new();
    for node in &nodes {
        let text = crate::explain::explain_with(&input.model, node, &key, input.hinted(&key), &input.pods)
            .ok_or_else(missing)?;
        texts.push(text);
    }
    let mut out = texts.join("\n");
    if let Some(bpffs) = &args.bpffs {
        for (name, dir) in pins::instances(bpffs, args.instance.as_deref())? {
            let maps = crate::datapath::ebpf::KernelMaps::open_pinned(&dir)?;
            let inst = crate::status::Instance::read(&name, &maps, crate::datapath::marks::boottime_ns())?;
            out.push_str(&crate::explain::skipped_now(&inst, &key));
        }
    }
    Ok(out)
}

/// `tierlb plan`'s exit status when it printed the plan of the valid objects but some input is invalid (an
/// object the API server would refuse, a document that does not parse, a duplicate): 1 is taken by errors
/// that stop a command, 2 by clap's usage errors.
pub const EXIT_INVALID_INPUT: u8 = 3;

/// What `tierlb plan` prints, and whether the input had errors (`EXIT_INVALID_INPUT`).
pub struct PlanOutput {
    /// The table or JSON of the valid objects.
    pub text: String,
    /// Error diagnostics (printed to stderr already): objects, documents or files not planned.
    pub errors: usize,
}

/// `tierlb plan`: the table or JSON of every valid object; the invalid ones are reported on stderr and
/// counted, so that the command can exit non-zero after printing the plan.
pub fn run_plan(args: &PlanArgs) -> anyhow::Result<PlanOutput> {
    plan_on(args, &args.source.load(None)?)
}

/// `tierlb plan` of an input already read.
pub fn plan_on(args: &PlanArgs, input: &super::CliInput) -> anyhow::Result<PlanOutput> {
    let (model, errors) = (&input.model, input.errors);
    let empty = model.services.is_empty() && model.skipped.is_empty();
    if empty {
        // kubectl's words for an empty list, on stderr, exit status 0, and no table.
        eprintln!("No resources found in {}.", input.origin);
    }
    let names: Vec<String> = match &args.node {
        Some(n) => vec![n.clone()],
        None => lint::cluster_nodes(model).into_iter().map(|n| n.name).collect(),
    };
    // Each node resolved once: resolving says on stderr what it assumed (a zone from endpoints, a typo).
    let resolved: Vec<_> = names.iter().map(|n| input.node_named(n, &args.site)).collect();
    let plans: Vec<Plan> = resolved.iter().map(|n| plan::plan(model, n)).collect();
    let lints: Vec<lint::Lints> =
        plans.iter().zip(&resolved).map(|(p, n)| lint::lint_naming(model, n, p, &input.pods)).collect();
    let linted: Vec<lint::LintedPlan<'_>> =
        plans.iter().zip(&lints).map(|(p, l)| lint::LintedPlan::new(p, l).emulated(&input.filled)).collect();
    let text = if empty && args.output.is_table() {
        String::new()
    } else if args.all_nodes {
        args.output.render(&linted, |wide| {
            let notes = |l| TableNotes {
                lints: Some(l),
                emulated: &input.filled,
                unhinted: &input.unhinted,
                wide: wide.then_some(model),
            };
            all_nodes_table(&plans, &lints, notes)
        })?
    } else {
        args.output.render(&linted[0], |wide| {
            let notes = TableNotes {
                lints: Some(&lints[0]),
                emulated: &input.filled,
                unhinted: &input.unhinted,
                wide: wide.then_some(model),
            };
            plan_table(&plans[0], &notes)
        })?
    };
    if errors > 0 {
        eprintln!(
            "tierlb: {errors} error(s) in {}: the objects named above are not planned (fix them; exit status \
             {EXIT_INVALID_INPUT})",
            input.origin
        );
    }
    Ok(PlanOutput { text, errors })
}
