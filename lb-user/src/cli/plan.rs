//! `tierlb plan` and `tierlb explain`: which endpoints each Service port uses on a node, as a table (contested
//! VIP:ports marked) or JSON, and one Service explained in words.
use std::{fmt::Write as _, net::SocketAddr};

use super::{FaceSource, NodeArgs};
use crate::{
    datapath::pins,
    lint,
    output::Output,
    plan::{self, Plan},
};

/// `tierlb plan`.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The node to plan for.
    #[command(flatten)]
    pub node: NodeArgs,
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
    /// The Service, NAMESPACE/NAME (with --kube, only its namespace is read).
    pub service: crate::model::ObjKey,
    /// The node to explain for.
    #[command(flatten)]
    pub node: NodeArgs,
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
}

/// `tierlb explain`: the explanation text.
pub fn run_explain(args: &ExplainArgs) -> anyhow::Result<String> {
    if let Some(ns) = args.source.namespace.as_ref().filter(|ns| ns.as_str() != &*args.service.namespace) {
        anyhow::bail!(
            "--namespace {ns} does not hold Service {}: drop --namespace (explain reads its Service's)",
            args.service
        );
    }
    let input = args.source.load(Some(&args.service.namespace))?;
    explain_on(args, &input)
}

/// `tierlb explain` of an input already read.
pub fn explain_on(args: &ExplainArgs, input: &super::CliInput) -> anyhow::Result<String> {
    let node = input.node(&args.node);
    let mut out = crate::explain::explain(&input.model, &node, &args.service).ok_or_else(|| {
        anyhow::anyhow!(
            "no Service {} in {} (a manifest without metadata.namespace is in namespace \"default\")",
            args.service,
            input.origin
        )
    })?;
    if let Some(bpffs) = &args.bpffs {
        for (name, dir) in pins::instances(bpffs, args.instance.as_deref())? {
            let maps = crate::datapath::ebpf::KernelMaps::open_pinned(&dir)?;
            let inst = crate::status::Instance::read(&name, &maps, crate::datapath::marks::boottime_ns())?;
            out.push_str(&crate::explain::skipped_now(&inst, &args.service));
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
    let node = input.node(&args.node);
    let p = plan::plan(model, &node);
    let text = match args.output {
        Output::Json => {
            let lints = lint::lint(model, &node, &p);
            serde_json::to_string_pretty(&lint::LintedPlan::new(&p, &lints))? + "\n"
        }
        Output::Table => plan_table(&p),
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

fn join(v: &[SocketAddr]) -> String {
    if v.is_empty() { "-".into() } else { v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",") }
}

/// A fixed-width table, one row per Service port and family. A cluster IP another Service holds is marked
/// `(not-programmed)` (one word: the cells split on spaces), and every claim that loses a contested VIP:port is listed below the table.
pub fn plan_table(p: &Plan) -> String {
    let claims = plan::claim_table(&p.services);
    let winner = |addr: SocketAddr, p: &plan::PortPlan| {
        claims.get(&(addr, p.protocol)).and_then(plan::vip_winner).map(|c| &c.service)
    };
    let mut lost = Vec::new();
    let mut rows = vec![[
        "SERVICE".to_owned(),
        "PORT".into(),
        "VIPS".into(),
        "POLICY".into(),
        "TIER".into(),
        "ENDPOINTS".into(),
        "FALLBACK (zone | cluster)".into(),
        "WHEN EMPTY".into(),
    ]];
    for s in &p.services {
        for (addr, _) in plan::claims_of(s) {
            if let Some(w) = winner(addr, s).filter(|w| **w != s.name.service) {
                lost.push(format!(
                    "{} {addr}/{}: NOT programmed until {w} leaves it",
                    s.name,
                    s.protocol.as_str()
                ));
            }
        }
        let vips: Vec<String> = s
            .cluster_ips
            .iter()
            .map(|ip| {
                let held = winner(SocketAddr::new(*ip, s.port), s).is_some_and(|w| *w != s.name.service);
                if held { format!("{ip}(not-programmed)") } else { ip.to_string() }
            })
            .collect();
        let t = &s.internal;
        rows.push([
            s.name.to_string(),
            format!("{}/{}", s.port, s.protocol.as_str()),
            vips.join(","),
            t.policy.as_str().to_owned(),
            serde_json::to_value(t.selected_tier)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            join(&t.endpoints),
            format!("{} | {}", join(&t.tiers.zone), join(&t.tiers.cluster)),
            t.when_empty.map_or("-".to_owned(), |w| format!("{w:?}").to_lowercase()),
        ]);
    }
    let mut widths = [0usize; 8];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = format!("node {} zone {}\n", p.node, p.zone.as_deref().unwrap_or("<none>"));
    for r in &rows {
        let line: Vec<String> = r.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if !lost.is_empty() {
        let _ = writeln!(out, "\ncontested VIP:ports ({}):", plan::VIP_RULE);
        for l in lost {
            let _ = writeln!(out, "  {l}");
        }
    }
    if !p.skipped.is_empty() {
        out.push_str("\nnot programmed:\n");
        for s in &p.skipped {
            let _ = writeln!(out, "  {s}");
        }
    }
    out
}
