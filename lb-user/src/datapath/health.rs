//! Passive health as user space sees it: the settings the agent writes (`--health-failures`, `--health-hold`,
//! `--health-max-hold`, `--health-clients`), how a `Health` entry reads at a time (`state`), and the agent's sweep of the map the
//! kernel writes: entries of backends that left every Service go (the EndpointSlice stays the source of
//! truth: a pod IP reused later starts healthy), healthy entries (reset by a success) go, and each backend
//! newly held or healthy again is reported for the log.
use std::{collections::BTreeMap, time::Duration};

use lb_common::{Backend, HEALTH_REFUSED, HEALTH_TIMEOUT, HEALTH_UNREACHABLE, Health, HealthConfig};
use serde::Serialize;

use super::{MapError, MapWriter};

/// Passive health settings, from the agent's flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    /// Consecutive failed connects that hold a backend down (`--health-failures`); 0 is off.
    pub failures: u32,
    /// The first hold (`--health-hold`); each further hold without a success doubles it.
    pub hold: Duration,
    /// The longest hold (`--health-max-hold`).
    pub max_hold: Duration,
    /// Distinct clients (network namespaces) among the failures that a hold needs (`--health-clients`, 1 or 2).
    pub clients: u32,
}

impl Default for HealthSettings {
    fn default() -> Self {
        Self { failures: 3, hold: Duration::from_secs(5), max_hold: Duration::from_mins(2), clients: 2 }
    }
}

impl HealthSettings {
    /// The map value the data path reads.
    pub fn config(&self) -> HealthConfig {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        HealthConfig {
            failures: self.failures,
            // On until the agent's first sweep finds the map empty (pins may hold entries).
            active: 1,
            hold_ns: ns(self.hold),
            max_hold_ns: ns(self.max_hold).max(ns(self.hold)),
            clients: self.clients,
            _pad: 0,
        }
    }
}

/// A passive-health hold as `--health-hold` and `--health-max-hold` give it (`marks::parse_span`); zero is
/// refused (no hold is what `--health-failures 0` asks for).
pub fn parse_hold(s: &str) -> Result<Duration, String> {
    let d = super::marks::parse_span(s)?;
    if d.is_zero() {
        return Err(format!(
            "{s:?}: a hold must last some time (to turn passive health off: --health-failures 0)"
        ));
    }
    Ok(d)
}

/// Where a backend stands, as `status` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthState {
    /// Connects failed, fewer than the threshold in a row: still used.
    Failing,
    /// Held down: new connects skip it until the hold ends.
    Held,
    /// Held down for one client (network namespace) only, whose own connects failed while no other
    /// client's had: its connects skip it, the others' use it.
    HeldForOneClient,
    /// The hold is over: the next connect that picks it is a trial, whose outcome clears or renews the hold.
    HalfOpen,
    /// Healthy (an entry reset by a success, which the agent deletes).
    Healthy,
}

impl HealthState {
    /// As `status` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failing => "failing",
            Self::Held => "held down",
            Self::HeldForOneClient => "held down for one client",
            Self::HalfOpen => "half-open (next connect is a trial)",
            Self::Healthy => "healthy",
        }
    }
}

/// What the last failure was.
pub fn reason(h: &Health) -> &'static str {
    match h.reason {
        HEALTH_REFUSED => "refused",
        HEALTH_TIMEOUT => "timeout",
        HEALTH_UNREACHABLE => "unreachable",
        _ => "-",
    }
}

/// `h` at `now_ns`.
pub fn state(h: &Health, now_ns: u64) -> HealthState {
    if h.held_until_ns == 0 {
        if h.failures == 0 { HealthState::Healthy } else { HealthState::Failing }
    } else if now_ns < h.held_until_ns {
        if h.scope == lb_common::HOLD_CLIENT { HealthState::HeldForOneClient } else { HealthState::Held }
    } else {
        HealthState::HalfOpen
    }
}

/// What one sweep of the health map did and saw.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HealthSweep {
    /// Backends held down since the last sweep (or held again), with their entry.
    pub held: Vec<(Backend, Health)>,
    /// Backends held at the last sweep that a successful connect made healthy since.
    pub recovered: Vec<Backend>,
    /// Entries deleted because their backend left every Service.
    pub departed: Vec<Backend>,
}

/// Sweep the health map, whose `entries` were just read: delete the entries of backends `in_use` says no
/// Service holds and healthy ones, and report what changed since `last` (the holds seen at the previous
/// sweep: backend -> hold start), which is updated.
pub fn sweep(
    w: &mut impl MapWriter,
    entries: Vec<(Backend, Health)>,
    in_use: impl Fn(&Backend) -> bool,
    last: &mut BTreeMap<Backend, u64>,
) -> Result<HealthSweep, MapError> {
    let mut out = HealthSweep::default();
    let mut now_held = BTreeMap::new();
    for (backend, h) in entries {
        if !in_use(&backend) {
            w.delete_health(backend)?;
            out.departed.push(backend);
            continue;
        }
        if h.held_until_ns != 0 {
            if last.get(&backend) != Some(&h.held_since_ns) {
                out.held.push((backend, h));
            }
            now_held.insert(backend, h.held_since_ns);
        } else if h.failures == 0 {
            // Reset by a success. Read again just before: a failure since then keeps it.
            if w.backend_health(backend)? == Some(h) {
                w.delete_health(backend)?;
            }
        }
    }
    out.recovered = last.keys().filter(|b| !now_held.contains_key(*b) && in_use(b)).copied().collect();
    *last = now_held;
    Ok(out)
}

/// Keep the data path's gate (`HealthConfig::active`) open exactly while `HEALTH` holds entries: set it if
/// the map has one and the flag is off; clear it if the map is empty, then read the map again and set it back
/// if `sock_ops` recorded a failure meanwhile (it sets the flag after writing its entry, so either the second
/// read sees the entry or the kernel's store comes after ours). Returns whether the gate is open.
pub fn gate(w: &mut impl MapWriter) -> Result<bool, MapError> {
    let cfg = w.health_config()?;
    let any = !w.health()?.is_empty();
    if any {
        if cfg.active == 0 {
            w.set_health_config(HealthConfig { active: 1, ..cfg })?;
        }
        return Ok(true);
    }
    if cfg.active == 0 {
        return Ok(false);
    }
    w.set_health_config(HealthConfig { active: 0, ..cfg })?;
    if w.health()?.is_empty() {
        return Ok(false);
    }
    w.set_health_config(HealthConfig { active: 1, ..cfg })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::datapath::{MapReader as _, addr, fake::FakeMaps};

    fn be(s: &str) -> Backend {
        addr::backend(s.parse::<SocketAddr>().unwrap(), 6)
    }

    fn entry(b: Backend, failures: u32, held: Option<(u64, u64)>) -> Health {
        let (since, until) = held.unwrap_or((0, 0));
        Health { backend: b, failures, held_since_ns: since, held_until_ns: until, ..Health::default() }
    }

    /// The gate follows the map: (entries?, flag before) -> (flag after, what `gate` says).
    #[test]
    fn the_health_gate_is_open_exactly_while_the_map_holds_entries() {
        let b = be("10.0.0.1:80");
        let cases = [
            ("empty map, gate open: closed", false, 1, 0, false),
            ("empty map, gate closed: stays closed", false, 0, 0, false),
            ("an entry, gate closed (set by an old agent's pins): opened", true, 0, 1, true),
            ("an entry, gate open: stays open", true, 1, 1, true),
        ];
        for (what, entry_present, before, after, open) in cases {
            let mut w = FakeMaps::default();
            let cfg = HealthSettings::default().config();
            w.set_health_config(HealthConfig { active: before, ..cfg }).unwrap();
            if entry_present {
                w.put_health(entry(b, 1, None));
            }
            assert_eq!(gate(&mut w).unwrap(), open, "{what}");
            let now = w.health_config().unwrap();
            assert_eq!(now.active, after, "{what}");
            assert_eq!((now.failures, now.hold_ns), (cfg.failures, cfg.hold_ns), "{what}: the settings kept");
        }
    }

    /// The race `gate` guards against, forced: the map is empty when the agent reads it, and `sock_ops`
    /// records a failure (its entry, then the flag) just before the agent clears the flag, which overwrites the
    /// kernel's: the data path would skip the map with a failing backend in it. The second read sees the entry
    /// and opens the gate again.
    #[test]
    fn a_failure_recorded_while_the_gate_closes_opens_it_again() {
        let b = be("10.0.0.1:80");
        let mut w = FakeMaps::default();
        let cfg = HealthSettings::default().config();
        w.set_health_config(HealthConfig { active: 1, ..cfg }).unwrap();
        w.fail_when_the_gate_closes(entry(b, 1, None));
        assert!(gate(&mut w).unwrap(), "open: a failure is recorded");
        assert_eq!(w.health_config().unwrap().active, 1, "the gate is open with the entry in the map");
        assert_eq!(w.health().unwrap().len(), 1);
    }

    fn sweep_all(
        w: &mut FakeMaps,
        in_use: impl Fn(&Backend) -> bool,
        last: &mut BTreeMap<Backend, u64>,
    ) -> Result<HealthSweep, MapError> {
        let entries = w.health()?;
        sweep(w, entries, in_use, last)
    }

    #[test]
    fn health_states_by_time() {
        let b = be("10.0.0.1:80");
        let cases = [
            ("no failure: healthy", entry(b, 0, None), 5, HealthState::Healthy),
            ("failures below the threshold", entry(b, 2, None), 5, HealthState::Failing),
            ("inside the hold", entry(b, 0, Some((1, 10))), 5, HealthState::Held),
            ("the hold is over: half-open", entry(b, 0, Some((1, 10))), 10, HealthState::HalfOpen),
        ];
        for (name, h, now, want) in cases {
            assert_eq!(state(&h, now), want, "{name}");
        }
    }

    #[test]
    fn holds_parse_as_durations_without_the_limits_of_a_mark() {
        assert_eq!(parse_hold("48h"), Ok(Duration::from_hours(48)), "a mark's 24 h limit is not a hold's");
        let zero = parse_hold("0s").unwrap_err();
        assert!(zero.contains("--health-failures 0"), "{zero}");
        assert!(parse_hold("5").unwrap_err().contains("is not a duration"));
    }

    #[test]
    fn the_hold_doubles_up_to_the_cap() {
        let cfg = HealthSettings {
            hold: Duration::from_secs(5),
            max_hold: Duration::from_secs(30),
            ..Default::default()
        }
        .config();
        let holds: Vec<u64> = (0..6).map(|n| Health::hold_for(n, &cfg) / 1_000_000_000).collect();
        assert_eq!(holds, [5, 10, 20, 30, 30, 30]);
        assert_eq!(Health::hold_for(u32::MAX, &cfg), cfg.max_hold_ns, "no overflow");
    }

    #[test]
    fn the_sweep_deletes_departed_and_healthy_entries_and_reports_transitions() {
        let mut w = FakeMaps::new(4, 4);
        let (held, failing, healthy, departed) =
            (be("10.0.0.1:80"), be("10.0.0.2:80"), be("10.0.0.3:80"), be("10.0.0.4:80"));
        w.put_health(entry(held, 0, Some((100, 200))));
        w.put_health(entry(failing, 1, None));
        w.put_health(entry(healthy, 0, None));
        w.put_health(entry(departed, 0, Some((100, 200))));
        let mut last = BTreeMap::new();
        let r = sweep_all(&mut w, |b| *b != departed, &mut last).unwrap();
        assert_eq!(r.held, [(held, entry(held, 0, Some((100, 200))))]);
        assert_eq!((r.recovered, r.departed), (vec![], vec![departed]));
        let left: Vec<Backend> = w.health().unwrap().into_iter().map(|(b, _)| b).collect();
        assert_eq!(left, [held, failing], "healthy and departed entries are deleted");
        // The same hold is reported once; a success resets it: healthy again.
        assert!(sweep_all(&mut w, |_| true, &mut last).unwrap().held.is_empty());
        w.put_health(entry(held, 0, None));
        let r = sweep_all(&mut w, |_| true, &mut last).unwrap();
        assert_eq!(r.recovered, [held]);
        // A new hold of the same backend is reported again.
        w.put_health(entry(failing, 0, Some((300, 400))));
        let r = sweep_all(&mut w, |_| true, &mut last).unwrap();
        assert_eq!(r.held.len(), 1);
    }
}
