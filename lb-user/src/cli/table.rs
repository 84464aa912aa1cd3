//! `tierlb plan`'s table: one row per Service port and family (one table of every node's with
//! `--all-nodes`), `-o wide`'s extra columns, and the sections under it.
use std::{fmt::Write as _, net::SocketAddr};

use crate::{
    lint,
    plan::{self, Plan},
};

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
    /// `-o wide`: the model the plan was made from, for the READY and TOPOLOGY columns.
    pub wide: Option<&'a crate::model::Model>,
}

/// The ENDPOINTS cell: each endpoint, marked `(terminating)` when the set is kube-proxy's fallback to serving
/// and terminating endpoints (a set has either ready endpoints only, or terminating ones only).
fn endpoints_cell(t: &plan::TrafficPlan, pp: &plan::PortPlan) -> String {
    let ready = if t.policy == crate::model::Policy::Local { pp.counts.local_ready } else { pp.counts.ready };
    join(&t.endpoints, if ready == 0 { "(terminating)" } else { "" })
}

/// `-o wide`'s cells: READY (ready of total endpoints, then how many are on this node) and TOPOLOGY
/// (`tierlb_service_topology`'s requested, applied and reason, as the agent reports them).
fn wide_cells(model: &crate::model::Model, pp: &plan::PortPlan, emulated: bool) -> [String; 2] {
    let c = &pp.counts;
    let ready = format!("{}/{},local={}", c.ready, c.total, c.local);
    let topology = model.services.get(&pp.name.service).map_or_else(
        || "-".to_owned(),
        |svc| {
            let s = plan::summarize(svc, pp).emulated(emulated);
            format!("{}:{}:{}", s.requested.as_str(), s.applied.as_str(), s.reason.as_str())
        },
    );
    [ready, topology]
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

/// The table's rows (a header, then one per Service port and family) and the claims that lose a contested
/// VIP:port.
fn rows(p: &Plan, notes: &TableNotes<'_>) -> (Vec<Vec<String>>, Vec<String>) {
    let claims = plan::claim_table(&p.services);
    let winner = |addr: SocketAddr, p: &plan::PortPlan| {
        claims.get(&(addr, p.protocol)).and_then(plan::vip_winner).map(|c| &c.service)
    };
    let mut lost = Vec::new();
    let mut rows = vec![vec![
        "SERVICE".to_owned(),
        "PORT".into(),
        "VIPS".into(),
        "POLICY".into(),
        "TIER".into(),
        "ENDPOINTS".into(),
        "FALLBACK (zone | cluster)".into(),
        "WHEN EMPTY".into(),
    ]];
    if notes.wide.is_some() {
        rows[0].extend(["READY".to_owned(), "TOPOLOGY (requested:applied:reason)".into()]);
    }
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
        let mut row = vec![
            s.name.to_string(),
            format!("{}/{}", s.port, s.protocol.as_str()),
            vips.join(","),
            t.policy.as_str().to_owned(),
            tier,
            endpoints_cell(t, s),
            format!("{} | {}", join(&t.tiers.zone, ""), join(&t.tiers.cluster, "")),
            when_empty_cell(t),
        ];
        if let Some(model) = notes.wide {
            row.extend(wide_cells(model, s, notes.emulated.contains(&s.name.service)));
        }
        rows.push(row);
    }
    (rows, lost)
}

/// `rows` in aligned columns.
fn aligned(rows: &[Vec<String>]) -> String {
    let mut widths = vec![0usize; rows.first().map_or(0, Vec::len)];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// A fixed-width table, one row per Service port and family. A cluster IP another Service holds is marked
/// `(not-programmed)` (one word: the cells split on spaces), endpoints of kube-proxy's terminating fallback
/// `(terminating)`, a tier planned on emulated hints `(emulated-hints)`; WHEN EMPTY gives the errno a
/// connect gets once no backend is left (prefixed `now:` when none is left already) beside kube-proxy's
/// verdict. Under the table: every claim that loses a contested VIP:port, the ports' warnings (`notes`),
/// the Services whose slices lack the hints they ask for, and what is not programmed.
pub fn plan_table(p: &Plan, notes: &TableNotes<'_>) -> String {
    let (rows, lost) = rows(p, notes);
    let mut out = format!("node {} zone {}\n", p.node, p.zone.as_deref().unwrap_or("<none>"));
    out.push_str(&aligned(&rows));
    sections(&mut out, p, &lost, notes);
    out
}

/// `plan --all-nodes`: one table of every node's rows, NODE first; under it the sections of `plan_table`
/// once (what they say does not depend on the node: each Service's warnings, contested VIP:ports, what is
/// not programmed). `notes` gives a node's notes from its lints.
pub fn all_nodes_table<'a>(
    plans: &[Plan],
    lints: &'a [lint::Lints],
    notes: impl Fn(&'a lint::Lints) -> TableNotes<'a>,
) -> String {
    let mut all = Vec::new();
    let mut first = None;
    for (p, l) in plans.iter().zip(lints) {
        let n = notes(l);
        let (rows, lost) = rows(p, &n);
        if all.is_empty() {
            all.push(std::iter::once("NODE".to_owned()).chain(rows[0].iter().cloned()).collect());
        }
        all.extend(rows.into_iter().skip(1).map(|r| std::iter::once(p.node.clone()).chain(r).collect()));
        first.get_or_insert((p, lost, n));
    }
    let mut out = aligned(&all);
    if let Some((p, lost, n)) = first {
        sections(&mut out, p, &lost, &n);
    }
    out
}

/// The sections under a table: contested VIP:ports, the notes, what is not programmed.
fn sections(out: &mut String, p: &Plan, lost: &[String], notes: &TableNotes<'_>) {
    if !lost.is_empty() {
        let _ = writeln!(out, "\ncontested VIP:ports ({}):", plan::VIP_RULE);
        for l in lost {
            let _ = writeln!(out, "  {l}");
        }
    }
    notes_text(out, p, notes);
    if !p.skipped.is_empty() {
        out.push_str("\nnot programmed:\n");
        for s in &p.skipped {
            let _ = writeln!(out, "  {s}");
        }
    }
}

/// The sections under `plan_table`'s table from `notes`: the warnings (a contested VIP:port is listed
/// there already), the Services on emulated hints and those whose slices lack the hints they ask for.
fn notes_text(out: &mut String, p: &Plan, notes: &TableNotes<'_>) {
    let warnings: Vec<String> = notes
        .lints
        .map(|l| {
            // The node's own first (`unknown-node`: every row below is about a node the source lacks).
            let node = l.node.iter().map(|w| format!("{}: {w}", w.rule));
            let ports = p
                .services
                .iter()
                .zip(&l.ports)
                // A contested VIP:port is listed above already.
                .flat_map(|(s, ws)| {
                    ws.iter()
                        .filter(|w| w.rule != lint::Rule::VipConflict)
                        .map(move |w| format!("{} {w}", s.name))
                });
            node.chain(ports).collect()
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
