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
    let mut out = crate::explain::explain_with(
        &input.model,
        &node,
        &args.service,
        input.hinted(&args.service),
        &input.pods,
    )
    .ok_or_else(|| {
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
            let lints = lint::lint_naming(model, &node, &p, &input.pods);
            let plan = lint::LintedPlan::new(&p, &lints).emulated(&input.filled);
            serde_json::to_string_pretty(&plan)? + "\n"
        }
        Output::Table => {
            let lints = lint::lint_naming(model, &node, &p, &input.pods);
            plan_table(
                &p,
                &TableNotes { lints: Some(&lints), emulated: &input.filled, unhinted: &input.unhinted },
            )
        }
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

fn join(v: &[SocketAddr], suffix: &str) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.iter().map(|a| format!("{a}{suffix}")).collect::<Vec<_>>().join(",")
    }
}

/// What `plan_table` says besides the plan: each port's warnings, and where its hints come from.
#[derive(Default)]
pub struct TableNotes<'a> {
    /// The plan's lints (`lint::lint`), listed under the table.
    pub lints: Option<&'a lint::Lints>,
    /// Services planned on the hints the controller would write (`--emulate-hints`): their tier is labelled.
    pub emulated: &'a [crate::model::ObjKey],
    /// Services that ask for hints their slices do not carry, shown as they are.
    pub unhinted: &'a [crate::model::ObjKey],
}

/// The ENDPOINTS cell: each endpoint, marked `(terminating)` when the set is kube-proxy's fallback to serving
/// and terminating endpoints (a set has either ready endpoints only, or terminating ones only).
fn endpoints_cell(t: &plan::TrafficPlan, pp: &plan::PortPlan) -> String {
    let ready = if t.policy == crate::model::Policy::Local { pp.counts.local_ready } else { pp.counts.ready };
    join(&t.endpoints, if ready == 0 { "(terminating)" } else { "" })
}

/// The WHEN EMPTY cell: what a connect gets from tierlb (its errno) beside kube-proxy's verdict, now when the
/// set is empty, else once every backend is marked down.
fn when_empty_cell(t: &plan::TrafficPlan) -> String {
    let (now, w) = match t.when_empty {
        Some(w) => ("now:", w),
        None => ("", t.when_all_down),
    };
    let errno = match w {
        plan::WhenEmpty::Reject => "ECONNREFUSED(kube-proxy:REJECT)",
        plan::WhenEmpty::Drop => "EHOSTUNREACH(kube-proxy:DROP)",
    };
    format!("{now}{errno}")
}

/// A fixed-width table, one row per Service port and family. A cluster IP another Service holds is marked
/// `(not-programmed)` (one word: the cells split on spaces), endpoints of kube-proxy's terminating fallback
/// `(terminating)`, a tier planned on emulated hints `(emulated-hints)`; WHEN EMPTY gives the errno a
/// connect gets once no backend is left (prefixed `now:` when none is left already) beside kube-proxy's
/// verdict. Under the table: every claim that loses a contested VIP:port, the ports' warnings (`notes`),
/// the Services whose slices lack the hints they ask for, and what is not programmed.
pub fn plan_table(p: &Plan, notes: &TableNotes<'_>) -> String {
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
        let mut tier = serde_json::to_value(t.selected_tier)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        if notes.emulated.contains(&s.name.service) && t.policy == crate::model::Policy::Cluster {
            tier.push_str("(emulated-hints)");
        }
        rows.push([
            s.name.to_string(),
            format!("{}/{}", s.port, s.protocol.as_str()),
            vips.join(","),
            t.policy.as_str().to_owned(),
            tier,
            endpoints_cell(t, s),
            format!("{} | {}", join(&t.tiers.zone, ""), join(&t.tiers.cluster, "")),
            when_empty_cell(t),
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
    notes_text(&mut out, p, notes);
    if !p.skipped.is_empty() {
        out.push_str("\nnot programmed:\n");
        for s in &p.skipped {
            let _ = writeln!(out, "  {s}");
        }
    }
    out
}

/// The sections under `plan_table`'s table from `notes`: the warnings (a contested VIP:port is listed
/// there already), the Services on emulated hints and those whose slices lack the hints they ask for.
fn notes_text(out: &mut String, p: &Plan, notes: &TableNotes<'_>) {
    let warnings: Vec<String> = notes
        .lints
        .map(|l| {
            p.services
                .iter()
                .zip(&l.ports)
                // A contested VIP:port is listed above already.
                .flat_map(|(s, ws)| {
                    ws.iter()
                        .filter(|w| w.rule != lint::Rule::VipConflict)
                        .map(move |w| format!("{} {w}", s.name))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let warnings: Vec<String> = warnings.into_iter().filter(|w| seen.insert(w.clone())).collect();
    if !warnings.is_empty() {
        let _ = writeln!(out, "\nwarnings ({}):", warnings.len());
        for w in warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    if !notes.emulated.is_empty() {
        out.push_str(
            "\nemulated hints (--emulate-hints: the slices carry none; planned with the hints the EndpointSlice \
             controller would write, as the agent does; kube-proxy uses every endpoint):\n",
        );
        for k in notes.emulated {
            let _ = writeln!(out, "  {k}");
        }
    }
    if !notes.unhinted.is_empty() {
        out.push_str(
            "\nslices without the hints their Service asks for (shown as they are, as kube-proxy reads them; the \
             agent plans them with the controller's hints: --emulate-hints shows that):\n",
        );
        for k in notes.unhinted {
            let _ = writeln!(out, "  {k}");
        }
    }
}
