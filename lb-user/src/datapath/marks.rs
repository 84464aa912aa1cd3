//! Manual backend marks (`tierlb backend down ADDR --for DURATION`): a backend is down until a time, then the
//! data path uses it again by itself; the agent deletes marks that expired and marks of addresses that left
//! every Service (so a pod IP reused later does not inherit a mark meant for the pod that had it before).
//!
//! Times are `CLOCK_BOOTTIME` nanoseconds, the clock `bpf_ktime_get_boot_ns` reads in the data path: expiry
//! is decided in BPF, exactly, whether or not an agent runs.
use std::time::Duration;

use lb_common::{Backend, BackendState};

use super::{MapError, MapWriter};

/// How long `tierlb backend down` holds a backend down when no `--for` is given.
pub const DEFAULT_MARK: Duration = Duration::from_mins(10);
/// The longest mark: a backend that should stay out longer belongs out of the Service's endpoints (a
/// readiness probe, a drain), where every node and kube-proxy see it, not in one node's marks.
pub const MAX_MARK: Duration = Duration::from_hours(24);

/// `CLOCK_BOOTTIME` now, in nanoseconds.
pub fn boottime_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_BOOTTIME exists on every kernel tierlb supports
    // (>= 2.6.39), so the call cannot fail.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME)");
    ts.tv_sec.cast_unsigned().saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec.cast_unsigned())
}

/// A duration as the CLI writes it: a number and a unit (`ms`, `s`, `m`, `h`), repeated (`1h30m`); anything
/// else is refused. Zero is a duration here: what it means is the caller's to judge.
pub fn parse_span(s: &str) -> Result<Duration, String> {
    let bad =
        || format!("{s:?} is not a duration: write a number and a unit (ms, s, m, h), as 90s, 10m or 1h30m");
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            _ => return Err(bad()),
        };
        total = total.saturating_add(part);
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// A mark's length as `--for` gives it (`parse_span`). Refused besides: zero and more than `MAX_MARK`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let total = parse_span(s)?;
    if total.is_zero() {
        return Err(format!(
            "{s:?}: a mark must last some time (to mark a backend up again: `tierlb backend up ADDR`)"
        ));
    }
    if total > MAX_MARK {
        return Err(format!(
            "{s:?} is longer than the longest mark ({}h): a backend that should stay out that long belongs out \
             of its Service's endpoints (fail its readiness probe, or drain it)",
            MAX_MARK.as_secs() / 3600
        ));
    }
    Ok(total)
}

/// A duration as `status` and `backend` print it: `1h02m`, `9m58s`, `12s`, `0.4s`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..10 => format!("{:.1}s", d.as_secs_f64()),
        10..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// Mark `backend` down for `length` from `now_ns`. A mark still running keeps its start (its age is how
/// long the backend has been down) and gets the new end.
pub fn mark_down(
    w: &mut impl MapWriter,
    backend: Backend,
    length: Duration,
    now_ns: u64,
) -> Result<BackendState, MapError> {
    let until = now_ns.saturating_add(u64::try_from(length.as_nanos()).unwrap_or(u64::MAX));
    let since = match w.backend_mark(backend)? {
        Some(m) if m.is_down_at(now_ns) => m.since_ns,
        _ => now_ns,
    };
    let mark = BackendState::down(since, until);
    w.put_backend_mark(backend, mark)?;
    Ok(mark)
}

/// What one sweep deleted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Marks whose time was over (the data path already ignored them).
    pub expired: Vec<Backend>,
    /// Marks of backends no applied frontend holds any more.
    pub departed: Vec<Backend>,
}

/// Delete marks that expired and marks of backends `in_use` says no Service holds. A mark is read again
/// just before it is deleted and kept if it changed in between (a `tierlb backend down` racing the sweep).
pub fn sweep(
    w: &mut impl MapWriter,
    in_use: impl Fn(&Backend) -> bool,
    now_ns: u64,
) -> Result<SweepReport, MapError> {
    let mut report = SweepReport::default();
    for (backend, mark) in w.backend_marks()? {
        let list = if !mark.is_down_at(now_ns) {
            &mut report.expired
        } else if !in_use(&backend) {
            &mut report.departed
        } else {
            continue;
        };
        if w.backend_mark(backend)? == Some(mark) {
            w.delete_backend_mark(backend)?;
            list.push(backend);
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;
    use crate::datapath::{MapReader as _, addr, fake::FakeMaps};

    fn be(s: &str) -> Backend {
        addr::backend(s.parse::<SocketAddr>().unwrap(), 6)
    }

    #[test]
    fn durations_are_bounded_and_zero_is_refused() {
        assert_eq!(parse_duration("10m"), Ok(Duration::from_mins(10)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_mins(90)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("24h"), Ok(MAX_MARK));
        let zero = parse_duration("0s").unwrap_err();
        assert!(zero.contains("must last some time") && zero.contains("backend up"), "{zero}");
        let long = parse_duration("25h").unwrap_err();
        assert!(long.contains("longer than the longest mark (24h)"), "{long}");
        assert!(parse_duration("99999999999999999999h").is_err(), "overflow is refused");
        for bad in ["", "10", "m", "10 m", "1.5h", "10d", "-1s", "10mm"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("is not a duration") && e.contains("10m"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn durations_print_short() {
        let f = |ms| human(Duration::from_millis(ms));
        assert_eq!([f(400), f(12_000), f(598_000), f(3_720_000)], ["0.4s", "12s", "9m58s", "1h02m"]);
    }

    #[test]
    fn a_new_mark_keeps_the_start_of_a_running_one_but_not_of_an_expired_one() {
        let mut w = FakeMaps::new(4, 4);
        let b = be("10.244.1.10:8080");
        let m = mark_down(&mut w, b, Duration::from_secs(10), 1_000).unwrap();
        assert_eq!((m.since_ns, m.until_ns), (1_000, 10_000_001_000));
        let again = mark_down(&mut w, b, Duration::from_secs(1), 2_000).unwrap();
        assert_eq!(
            (again.since_ns, again.until_ns),
            (1_000, 1_000_002_000),
            "the new length counts from now"
        );
        let after = mark_down(&mut w, b, Duration::from_secs(1), 5_000_000_000).unwrap();
        assert_eq!(after.since_ns, 5_000_000_000, "an expired mark is a new mark");
    }

    #[test]
    fn the_sweep_deletes_expired_marks_and_marks_of_departed_backends() {
        let mut w = FakeMaps::new(4, 4);
        let (kept, expired, departed) = (be("10.0.0.1:80"), be("10.0.0.2:80"), be("10.0.0.3:80"));
        for b in [kept, expired, departed] {
            mark_down(&mut w, b, Duration::from_mins(1), 0).unwrap();
        }
        w.put_backend_mark(expired, BackendState::down(0, 10)).unwrap();
        let r = sweep(&mut w, |b| *b != departed, 100).unwrap();
        assert_eq!(r, SweepReport { expired: vec![expired], departed: vec![departed] });
        let left: Vec<Backend> = w.backend_marks().unwrap().into_iter().map(|(b, _)| b).collect();
        assert_eq!(left, [kept]);
        assert_eq!(sweep(&mut w, |_| true, 100).unwrap(), SweepReport::default(), "nothing more to do");
    }
}
