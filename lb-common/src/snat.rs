//! The SNAT source ports as one numbered set: a range less two holes (the node's ephemeral range and the
//! NodePort range, `NatConfig::snat_ports`), so a try can pick any of them uniformly.

/// The SNAT source ports: `lo..=hi` less two holes (sorted, clipped to the range, merged where they meet),
/// numbered from 0 without the holes so a try can pick any of them uniformly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnatPorts {
    lo: u16,
    hi: u16,
    /// Holes inside `lo..=hi`, the first below the second; an empty hole is `(1, 0)`.
    holes: [(u16, u16); 2],
}

impl SnatPorts {
    /// `lo..=hi` (`lo <= hi`) less the holes `a` and `b` (inclusive, any order, may overlap or lie outside).
    #[must_use]
    pub const fn new(lo: u16, hi: u16, a: (u16, u16), b: (u16, u16)) -> Self {
        let (mut x, mut y) = if a.0 <= b.0 { (a, b) } else { (b, a) };
        if x.1 >= y.0 && x.0 <= x.1 && y.0 <= y.1 {
            // Overlapping or touching: one hole.
            if y.1 > x.1 {
                x.1 = y.1;
            }
            y = (1, 0);
        }
        Self { lo, hi, holes: [clip(x, lo, hi), clip(y, lo, hi)] }
    }

    /// How many ports there are.
    #[must_use]
    pub const fn count(&self) -> u32 {
        let mut n = self.hi as u32 - self.lo as u32 + 1;
        let mut i = 0;
        while i < 2 {
            let (a, b) = self.holes[i];
            if a <= b {
                n -= b as u32 - a as u32 + 1;
            }
            i += 1;
        }
        n
    }

    /// Port number `i` (`i < count()`).
    #[must_use]
    pub const fn at(&self, index: u32) -> u16 {
        let mut port = self.lo as u32 + index;
        let mut hole = 0;
        while hole < 2 {
            let (first, last) = self.holes[hole];
            if first <= last && port >= first as u32 {
                port += last as u32 - first as u32 + 1;
            }
            hole += 1;
        }
        port as u16
    }

    /// Whether `port` is one of them.
    #[must_use]
    pub const fn contains(&self, port: u16) -> bool {
        if port < self.lo || port > self.hi {
            return false;
        }
        let mut h = 0;
        while h < 2 {
            let (a, b) = self.holes[h];
            if a <= b && port >= a && port <= b {
                return false;
            }
            h += 1;
        }
        true
    }

    /// The port for try `attempt` of a flow whose random seed is `seed` (host order): successive tries walk
    /// the ports by a large odd stride from a random start, so a crowded region is left after a few tries.
    #[must_use]
    pub const fn pick(&self, seed: u32, attempt: u32) -> u16 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        self.at(seed.wrapping_add(attempt.wrapping_mul(40_503)) % n)
    }
}

/// Hole `h` clipped to `lo..=hi` (`(1, 0)`: empty).
const fn clip(h: (u16, u16), lo: u16, hi: u16) -> (u16, u16) {
    let a = if h.0 < lo { lo } else { h.0 };
    let b = if h.1 > hi { hi } else { h.1 };
    if a > b { (1, 0) } else { (a, b) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NatConfig, SNAT_TRIES};

    #[test]
    fn snat_ports_are_the_range_less_the_ephemeral_and_node_port_ranges() {
        let p = NatConfig::default().snat_ports();
        // 1024-29999 and 61000-65535.
        assert_eq!(p.count(), (29_999 - 1_024 + 1) + (65_535 - 61_000 + 1));
        assert_eq!(p.at(0), 1_024);
        assert_eq!(p.at(29_999 - 1_024), 29_999);
        assert_eq!(p.at(29_999 - 1_024 + 1), 61_000);
        assert_eq!(p.at(p.count() - 1), 65_535);
        for (port, inside) in
            [(1_023, false), (1_024, true), (29_999, true), (30_000, false), (32_767, false)]
        {
            assert_eq!(p.contains(port), inside, "{port}");
        }
        for (port, inside) in [(32_768, false), (60_999, false), (61_000, true), (65_535, true)] {
            assert_eq!(p.contains(port), inside, "{port}");
        }
        for i in (0..p.count()).step_by(97) {
            assert!(p.contains(p.at(i)), "port {i} is {}", p.at(i));
        }
        for seed in [0, 1, 4_000_000_000, u32::MAX] {
            let ports: Vec<u16> = (0..SNAT_TRIES).map(|a| p.pick(seed, a)).collect();
            assert!(ports.iter().all(|&x| p.contains(x)), "{ports:?}");
            let mut d = ports.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), ports.len(), "tries repeat a port: {ports:?}");
        }
    }

    #[test]
    fn snat_port_holes_are_sorted_clipped_and_merged() {
        // Holes given in either order, overlapping: one hole 100-300.
        let p = SnatPorts::new(50, 400, (200, 300), (100, 250));
        assert_eq!(p.count(), 351 - 201);
        assert!(p.contains(99) && !p.contains(100) && !p.contains(300) && p.contains(301));
        // A hole beyond the range is clipped away; a one-port range.
        let p = SnatPorts::new(5_000, 5_000, (6_000, 7_000), (1, 10));
        assert_eq!((p.count(), p.pick(7, 3)), (1, 5_000));
        // The node's ephemeral range set wide by its operator: what remains.
        let c = NatConfig { ephemeral_min: 1_024, ephemeral_max: 65_000, ..NatConfig::default() };
        assert_eq!(c.snat_ports().count(), 535);
        // Everything cut out: no port (a new SNAT flow is dropped and counted).
        assert_eq!(SnatPorts::new(1_024, 2_000, (1_000, 3_000), (1, 0)).count(), 0);
    }
}
