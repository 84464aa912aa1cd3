//! `tierlb study`'s table: per phase one row per model, then what passive health cost tierlb on each node.
use std::fmt::Write as _;

use super::{Crash, ModelResult, PhaseResult, Scenario, StudyResult};

/// A share as the table prints it: whole percents, with one decimal below 1% so that a few lost requests
/// do not read as none.
pub(super) fn pct(v: f64) -> String {
    if v > 0.0 && v < 0.01 { format!("{:.1}%", v * 100.0) } else { format!("{:.0}%", v * 100.0) }
}

/// A number of requests from the fluid model: whole when it is, else one decimal.
pub(super) fn count(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 { format!("{v:.0}") } else { format!("{v:.1}") }
}

/// What tierlb's passive health cost in a phase: per (client node, crashed endpoint) a line up to the hold
/// and, with a duration, one after it.
fn detections_text(out: &mut String, p: &PhaseResult, m: &ModelResult) {
    let mut crashed: Vec<(&str, Crash)> =
        m.detections.iter().map(|d| (d.backend.as_str(), d.crash)).collect();
    crashed.dedup();
    let plural = |n: u32, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let connects = |v: f64| {
        let n = count(v);
        let s = if n == "1" { "" } else { "s" };
        format!("{n} connect{s}")
    };
    for (ip, crash) in crashed {
        let _ = writeln!(out, "  {}: {ip} {}", m.label, crash.describe());
        for d in m.detections.iter().filter(|d| d.backend == ip) {
            let lost = if crash.hangs() { "hung" } else { "failed" };
            let held = d.held_at_s.map_or_else(
                || "not held within the phase".to_owned(),
                |t| format!("held down at {t:.2} s (its connects fall back from then on)"),
            );
            let pods = plural(d.client_pods, "client pod");
            let _ =
                writeln!(out, "    {} ({pods}): {} {lost}, {held}", d.node, connects(d.failed_before_hold));
            match p.duration_s {
                Some(s) => {
                    let _ = writeln!(
                        out,
                        "      then {} as holds ended in {s:.0} s: {} {lost} after the hold, {}",
                        plural(d.failed_trials, "failed trial"),
                        connects(d.failed_after_hold),
                        plural(d.holds, "hold"),
                    );
                }
                None => {
                    let _ =
                        writeln!(out, "      (the phase has no duration: the row above is after detection)");
                }
            }
        }
    }
}

/// The human-readable form: per phase, one row per model, and what passive health cost tierlb.
pub fn table(r: &StudyResult) -> String {
    let mut out = format!("scenario {}: {}\n", r.scenario, r.description);
    let h = &r.health;
    let _ = writeln!(
        out,
        "tierlb's passive health (per node): K={} failed connects in a row hold a backend down for {:.0} s \
         (doubling to {:.0} s)",
        h.failures, h.hold_s, h.max_hold_s
    );
    if h.clients > 1 {
        let _ = writeln!(
            out,
            "  for all the node's client pods once they come from {} of them, else for the one pod that failed",
            h.clients
        );
    }
    let _ = writeln!(out, "{:.0} requests/s from all clients", r.requests_per_second);
    if r.phases.iter().any(|p| p.models.iter().any(|m| m.label.starts_with("cilium"))) {
        let _ = writeln!(out, "{}", crate::study::CILIUM_SETTING);
    }
    let width = r.phases.iter().flat_map(|p| p.models.iter().map(|m| m.label.len())).max().unwrap_or(5);
    for p in &r.phases {
        let _ = write!(out, "\n  phase {}", p.phase);
        if let (Some(d), Some(n)) = (p.duration_s, p.requests) {
            // Whole requests: a phase's total is an expectation (rate x time), never a fraction of one.
            let _ = write!(out, " ({d:.0} s, {:.0} requests)", n.round());
        }
        out.push('\n');
        let ips: Vec<&String> = p.models[0].shares.keys().collect();
        let _ = write!(out, "  {:<width$}", "MODEL");
        for ip in &ips {
            let _ = write!(out, " {ip:>12}");
        }
        let _ = writeln!(out, " {:>10} {:>10} {:>7} {:>6}", "CROSS-NODE", "CROSS-ZONE", "FAILED", "HANG");
        for m in &p.models {
            let _ = write!(out, "  {:<width$}", m.label);
            for ip in &ips {
                let _ = write!(out, " {:>12}", pct(m.shares[*ip]));
            }
            let _ = writeln!(
                out,
                " {:>10} {:>10} {:>7} {:>6}",
                pct(m.cross_node),
                pct(m.cross_zone),
                pct(m.failed),
                pct(m.hang)
            );
        }
        for m in p.models.iter().filter(|m| !m.detections.is_empty()) {
            detections_text(&mut out, p, m);
        }
    }
    out
}

/// A phase's figures as README's study table prints them: the endpoint shares in whole percents (the
/// scenario file's order, without `%`), cross-node and cross-zone, then what was lost (if anything).
fn figures(sc: &Scenario, m: &ModelResult) -> String {
    let shares: Vec<String> = sc
        .endpoints
        .iter()
        .map(|e| pct(m.shares[&e.ip.to_string()]).trim_end_matches('%').to_owned())
        .collect();
    let mut out = format!("{}; {}, {}", shares.join("/"), pct(m.cross_node), pct(m.cross_zone));
    let lost: Vec<String> = [(m.failed, "failed"), (m.hang, "hang")]
        .into_iter()
        .filter(|(v, _)| *v > 0.0)
        .map(|(v, what)| format!("{} {what}", pct(v)))
        .collect();
    if !lost.is_empty() {
        let _ = write!(out, "; {}", lost.join(", "));
    }
    out
}

/// README's study table, generated from `run` on each scenario in the order given: a row per distinct
/// figures of each phase (models with the same figures share a row, in the order of `MODELS`), the phase
/// named on its first row only.
pub fn markdown_table(scenarios: &[Scenario]) -> String {
    let mut out = String::from(
        "| scenario, phase | endpoint shares; cross-node, cross-zone; lost | models |\n|---|---|---|\n",
    );
    for sc in scenarios {
        let r = super::run(sc);
        for p in &r.phases {
            let mut rows: Vec<(String, Vec<String>)> = Vec::new();
            for m in &p.models {
                let f = figures(sc, m);
                let name = format!("`{}`", m.model.name());
                match rows.iter_mut().find(|(g, _)| *g == f) {
                    Some((_, names)) => names.push(name),
                    None => rows.push((f, vec![name])),
                }
            }
            let mut title = if p.phase == "initial" {
                r.scenario.clone()
            } else {
                format!("{}, {}", r.scenario, p.phase)
            };
            if let Some(d) = p.duration_s {
                let _ = write!(title, " ({d:.0} s)");
            }
            for (f, names) in rows {
                let _ = writeln!(out, "| {title} | {f} | {} |", names.join(", "));
                title.clear();
            }
        }
    }
    out
}
