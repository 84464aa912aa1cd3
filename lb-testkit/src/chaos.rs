//! What a chaos test needs besides the sandbox: a seeded random source (a failing run is replayed from its
//! seed), clients that keep connecting until told to stop, and the frontends two of tierlb's outputs describe
//! (`tierlb plan -o json`: what should be programmed; `tierlb status -o json`: what the pinned maps hold),
//! in one form so they can be compared.
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
};

use anyhow::Context as _;
use serde_json::Value;

use crate::probe::Report;

/// A small deterministic random source (splitmix64): the same seed gives the same sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A source starting at `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// An index into a slice of length `n` (`n` > 0).
    pub fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).expect("below n fits usize")
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items` (not empty).
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.index(items.len())]
    }
}

/// The seed from the environment variable `var` (decimal), else one from the clock; printed either way so a
/// failing run can be replayed with `var=SEED`.
#[must_use]
pub fn seed_from_env(var: &str) -> u64 {
    let seed = std::env::var(var).ok().and_then(|s| s.trim().parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    });
    eprintln!("chaos seed {seed} (replay: {var}={seed})");
    seed
}

/// A client that runs probe rounds (each a fresh process from `command`, which prints a probe `Report`)
/// one after another until stopped, and keeps every report.
pub struct ProbeLoop {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<anyhow::Result<Vec<Report>>>>,
}

impl ProbeLoop {
    /// Start rounds of `command()` (e.g. `tierlb-lab probe --target VIP --count 20`, confined to a pod) now.
    pub fn start(command: impl Fn() -> anyhow::Result<Command> + Send + 'static) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut reports = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let mut cmd = command()?;
                let out =
                    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit()).output()?;
                anyhow::ensure!(out.status.success(), "probe client failed ({})", out.status);
                let report: Report = serde_json::from_slice(&out.stdout).context("probe client output")?;
                reports.push(report);
            }
            Ok(reports)
        });
        Self { stop, thread: Some(thread) }
    }

    /// Stop after the round under way and return every round's report.
    pub fn finish(mut self) -> anyhow::Result<Vec<Report>> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().context("finished once")?;
        thread.join().map_err(|_| anyhow::anyhow!("probe loop panicked"))?
    }
}

impl Drop for ProbeLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One frontend (VIP, port, protocol) as programmed or to be programmed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendView {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The Service port's name.
    pub port_name: String,
    /// "Local" or "Cluster".
    pub policy: String,
    /// The node, zone and cluster tiers' backends (`IP:PORT`), sorted.
    pub tiers: [Vec<String>; 3],
}

/// Frontends by `VIP:PORT/PROTOCOL`.
pub type Frontends = BTreeMap<String, FrontendView>;

fn strings(v: &Value) -> Vec<String> {
    let mut out: Vec<String> =
        v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect();
    out.sort();
    out
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// The frontends `tierlb plan -o json` says the node's data path should hold (internal traffic: every
/// clusterIP of every Service port).
pub fn frontends_of_plan(plan: &Value) -> anyhow::Result<Frontends> {
    let mut out = Frontends::new();
    for s in plan["services"].as_array().context("plan: no services array")? {
        let port = u16::try_from(s["port"].as_u64().context("plan: a port")?)?;
        let internal = &s["internal"];
        let view = FrontendView {
            service: text(&s["service"]),
            port_name: text(&s["port_name"]),
            policy: text(&internal["policy"]),
            tiers: ["node", "zone", "cluster"].map(|t| strings(&internal["tiers"][t])),
        };
        for ip in s["cluster_ips"].as_array().into_iter().flatten() {
            let ip: IpAddr = text(ip).parse().context("plan: a clusterIP")?;
            let key = format!("{}/{}", SocketAddr::new(ip, port), text(&s["protocol"]));
            out.insert(key, view.clone());
        }
    }
    Ok(out)
}

/// The frontends `tierlb status -o json` read from one instance's pinned maps.
pub fn frontends_of_status(instance: &Value) -> anyhow::Result<Frontends> {
    let mut out = Frontends::new();
    for f in instance["frontends"].as_array().context("status: no frontends array")? {
        let tiers = [0, 1, 2].map(|t| {
            let mut v: Vec<String> =
                f["tiers"][t].as_array().into_iter().flatten().map(|b| text(&b["addr"])).collect();
            v.sort();
            v
        });
        let view = FrontendView {
            service: text(&f["service"]),
            port_name: text(&f["port_name"]),
            policy: text(&f["policy"]),
            tiers,
        };
        out.insert(format!("{}/{}", text(&f["frontend"]), text(&f["protocol"])), view);
    }
    Ok(out)
}

/// Where two frontend sets differ, one line per frontend (empty: equal).
#[must_use]
pub fn differences(want: &Frontends, got: &Frontends) -> Vec<String> {
    let mut out = Vec::new();
    for (k, w) in want {
        match got.get(k) {
            None => out.push(format!("{k}: missing, want {w:?}")),
            Some(g) if g != w => out.push(format!("{k}: got {g:?}, want {w:?}")),
            Some(_) => {}
        }
    }
    for (k, g) in got {
        if !want.contains_key(k) {
            out.push(format!("{k}: extra {g:?}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence_and_picks_stay_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..100).map(|_| a.below(10)).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.below(10)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| *x < 10));
        assert!((0..10).all(|v| xs.contains(&v)), "every value appears in 100 draws: {xs:?}");
        assert_ne!(Rng::new(8).next_u64(), Rng::new(7).next_u64());
    }

    #[test]
    fn plan_and_status_views_compare_by_frontend() {
        let plan = serde_json::json!({"services": [{
            "service": "default/web", "port_name": "main", "port": 80, "protocol": "TCP",
            "cluster_ips": ["10.96.0.1"],
            "internal": {"policy": "Cluster", "tiers": {"node": [], "zone": ["10.244.1.2:8080", "10.244.1.1:8080"], "cluster": []}},
        }]});
        let status = serde_json::json!({"frontends": [{
            "service": "default/web", "port_name": "main", "frontend": "10.96.0.1:80", "protocol": "TCP",
            "policy": "Cluster",
            "tiers": [[], [{"addr": "10.244.1.1:8080", "down": false}, {"addr": "10.244.1.2:8080", "down": false}], []],
        }]});
        let want = frontends_of_plan(&plan).unwrap();
        let got = frontends_of_status(&status).unwrap();
        assert!(differences(&want, &got).is_empty(), "{:?}", differences(&want, &got));
        let mut other = got.clone();
        other.get_mut("10.96.0.1:80/TCP").unwrap().tiers[1].pop();
        other.insert("10.96.0.2:80/TCP".into(), want["10.96.0.1:80/TCP"].clone());
        assert_eq!(differences(&want, &other).len(), 2);
    }
}
