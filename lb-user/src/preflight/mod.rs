//! `tierlb preflight`: whether a node can run the agent, checked before the agent trusts it (the DaemonSet
//! runs it as an init container). Each check says what it found and, where something is missing, the fix:
//! the kernel and what the programs need of it (the programs are verified, as the agent would load them),
//! cgroup v2 and bpffs where the agent is pointed, the capabilities it holds, and what else translates
//! connects or packets on the node (kube-proxy's rules, another tierlb instance, Cilium's or Calico's
//! programs).
use std::{fmt::Write as _, path::PathBuf};

use serde::Serialize;

use crate::{datapath::pins, output::Output};

mod conflicts;
mod features;
mod nft;
mod node;

/// `tierlb preflight`'s exit status when a check failed: the agent would not start, or would translate
/// beside another load balancer. 1 is taken by errors that stop the command, 2 by usage errors, 3 by
/// input that cannot be read (`plan`, `lint`).
pub const EXIT_NOT_READY: u8 = 4;

/// What `tierlb preflight` checks.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Exit status: 0 the node is ready (warnings may be printed); 1 the checks could not \
                        run; 2 usage error; 4 a check failed: the agent would not start here, or would \
                        translate beside another load balancer.")]
pub struct PreflightArgs {
    /// The cgroup the agent attaches to (its --cgroup).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup: PathBuf,
    /// Where the agent pins (its --bpffs).
    #[arg(long, env = pins::BPFFS_ENV, default_value = pins::DEFAULT_BPFFS)]
    pub bpffs: PathBuf,
    /// The agent's instance name (its --instance, else its --node): its own earlier programs and pins are
    /// not another instance's.
    #[arg(long)]
    pub instance: Option<String>,
    /// The agent's --healthz-addr, which must be free (kube-proxy's /healthz port).
    #[arg(long, default_value = "0.0.0.0:10256")]
    pub healthz_addr: crate::server::Listen,
    /// The agent's --metrics-addr, which must be free (kube-proxy's /metrics port).
    #[arg(long, default_value = "127.0.0.1:10249")]
    pub metrics_addr: crate::server::Listen,
    /// Skip verifying the programs (the slowest check: about a second on real hardware, 10 s and more under emulation).
    #[arg(long)]
    pub no_verify: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// As the agent needs it.
    Ok,
    /// Worth knowing; the agent runs.
    Warn,
    /// The agent would not start, or would translate beside another load balancer.
    Fail,
}

/// One check's finding.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    /// What was checked (`kernel`, `capabilities`, ...).
    pub check: &'static str,
    /// The verdict.
    pub result: Verdict,
    /// What was found.
    pub detail: String,
    /// What to do about it (empty when nothing is to be done).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

impl Check {
    fn ok(check: &'static str, detail: impl Into<String>) -> Self {
        Self { check, result: Verdict::Ok, detail: detail.into(), fix: String::new() }
    }

    fn warn(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { check, result: Verdict::Warn, detail: detail.into(), fix: fix.into() }
    }

    fn fail(check: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { check, result: Verdict::Fail, detail: detail.into(), fix: fix.into() }
    }
}

/// Every check's finding, in the order they ran.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The kernel's release (`uname -r`).
    pub kernel: String,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether no check failed.
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|c| c.result != Verdict::Fail)
    }

    fn table(&self) -> String {
        let width = self.checks.iter().map(|c| c.check.len()).max().unwrap_or(5).max(5);
        let mut out = format!("{:<width$}  RESULT  DETAIL\n", "CHECK");
        for c in &self.checks {
            let verdict = match c.result {
                Verdict::Ok => "ok",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            let _ = writeln!(out, "{:<width$}  {verdict:<6}  {}", c.check, c.detail);
            if !c.fix.is_empty() {
                let _ = writeln!(out, "{:<width$}  {:<6}  fix: {}", "", "", c.fix);
            }
        }
        let (fails, warns) = (self.count(Verdict::Fail), self.count(Verdict::Warn));
        let _ = if fails > 0 {
            writeln!(
                out,
                "not ready: {fails} check(s) failed, {warns} warning(s) (exit status {EXIT_NOT_READY})"
            )
        } else {
            writeln!(out, "ready for tierlb (kernel {}), {warns} warning(s)", self.kernel)
        };
        out
    }

    fn count(&self, v: Verdict) -> usize {
        self.checks.iter().filter(|c| c.result == v).count()
    }
}

/// Run every check.
pub fn check(args: &PreflightArgs) -> Report {
    let kernel = nix::sys::utsname::uname()
        .map_or_else(|_| "unknown".to_owned(), |u| u.release().to_string_lossy().into_owned());
    let instance = args.instance.clone();
    let mut checks = vec![features::kernel(&kernel), features::btf(), node::capabilities()];
    checks.push(node::cgroup(&args.cgroup));
    checks.push(node::bpffs(&args.bpffs));
    checks.extend(features::programs(!args.no_verify));
    checks.push(features::tc_attach());
    checks.extend(conflicts::cgroup(&args.cgroup, &args.bpffs, instance.as_deref()));
    checks.push(conflicts::devices());
    checks.extend(conflicts::kube_proxy());
    checks.push(conflicts::ports(&[
        (args.healthz_addr.0, "--healthz-addr"),
        (args.metrics_addr.0, "--metrics-addr"),
    ]));
    checks.push(conflicts::instances(&args.bpffs, instance.as_deref()));
    Report { kernel, checks }
}

/// `tierlb preflight`: the report in the chosen format, and whether the node is ready.
pub fn run(args: &PreflightArgs) -> anyhow::Result<(String, bool)> {
    let report = check(args);
    let text = args.output.render(&report, |_| report.table())?;
    Ok((text, report.ready()))
}
