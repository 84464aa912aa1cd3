//! The tier choice the data path makes on every connect, written once for the BPF programs and host tests:
//! which tier serves (`first_live_tier`, `choose`) and which backend in it (uniform among the live ones).
use crate::{
    FrontendValue, MemberValue, TIER_CLUSTER, TIER_COUNT, TIER_NODE, TIER_SCAN, TIER_ZONE, TierRange,
};

/// What a slot lookup found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot<B> {
    /// The slot exists and its backend is not marked down.
    Live(B),
    /// The slot exists but its backend is marked down.
    Down(B),
    /// The slot does not exist: the maps are inconsistent (internal error).
    Missing,
}

/// Outcome of the tier choice for one connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice<B> {
    /// Rewrite to this backend, taken from this tier.
    Backend {
        /// `TIER_NODE`, `TIER_ZONE` or `TIER_CLUSTER`: also the counter kind the pick is counted under.
        tier: usize,
        /// The backend to rewrite the destination to.
        backend: B,
    },
    /// No tier holds a live backend: fail the connect (which errno depends on `FLAG_EMPTY_IS_DROP`).
    Empty,
    /// A slot was missing: fail open.
    Error,
}

/// A number in `[0, n)` from a uniform 32-bit random value (Lemire's multiply-shift), for `n >= 1`. `r`
/// must use all 32 bits (as `bpf_get_prandom_u32` does); a 31-bit source would only ever give `[0, n/2)`.
///
/// Not `r % n`: a remainder needs a division-by-zero branch (a panic path the verifier rejects, or a branch on
/// `n` that makes the verifier track `n` exactly and explode the number of states it explores).
#[inline(always)]
#[must_use]
pub fn below(r: u32, n: u32) -> u32 {
    ((u64::from(r) * u64::from(n)) >> 32) as u32
}

/// `scan_tier` found no live backend in its window.
pub const SCAN_NONE: u32 = u32::MAX;
/// `scan_tier` met a missing slot (inconsistent maps).
pub const SCAN_ERROR: u32 = u32::MAX - 1;

/// Index of the first tier, in the order node, zone, cluster (`TIER_NODE`, `TIER_ZONE`, `TIER_CLUSTER`), that
/// holds a backend `live` accepts (one not marked down); `None` when no tier does, which the data path turns
/// into a refused connect (`Choice::Empty`).
///
/// This is the rule the data path applies: `choose` takes its backend from this tier, so host faces
/// (`tierlb status`, the study) call this function rather than re-deriving the order. The one place they can
/// differ is `choose`'s bounded slow path: in a tier longer than `TIER_SCAN` whose scanned window holds only
/// backends marked down, `choose` moves on although this function would name that tier (see `scan_tier`).
#[must_use]
pub fn first_live_tier<B>(tiers: [&[B]; TIER_COUNT], mut live: impl FnMut(&B) -> bool) -> Option<usize> {
    tiers.iter().position(|tier| tier.iter().any(&mut live))
}

/// The first tier holding any slot, in the data path's order (node, zone, cluster); `None` if all are empty.
/// Where `choose` draws first, and where the panic threshold of passive health draws from.
#[inline(always)]
#[must_use]
pub fn first_nonempty_tier(fe: &FrontendValue) -> Option<usize> {
    if fe.tiers[TIER_NODE].len != 0 {
        Some(TIER_NODE)
    } else if fe.tiers[TIER_ZONE].len != 0 {
        Some(TIER_ZONE)
    } else if fe.tiers[TIER_CLUSTER].len != 0 {
        Some(TIER_CLUSTER)
    } else {
        None
    }
}

/// The last tier holding any slot (cluster, zone, node in that order of asking); `None` if all are empty.
/// Where the panic threshold of passive health draws from: when every tier's backends are held, the holds of
/// the first tiers are the oldest evidence (the later tiers took the traffic and failed after them), so a
/// panic never forces traffic back onto a first tier held as dead while later ones are held too.
#[inline(always)]
#[must_use]
pub fn last_nonempty_tier(fe: &FrontendValue) -> Option<usize> {
    if fe.tiers[TIER_CLUSTER].len != 0 {
        Some(TIER_CLUSTER)
    } else if fe.tiers[TIER_ZONE].len != 0 {
        Some(TIER_ZONE)
    } else if fe.tiers[TIER_NODE].len != 0 {
        Some(TIER_NODE)
    } else {
        None
    }
}

/// The tier choice the data path makes on every connect, written once for BPF and host tests.
///
/// The tier is the one `first_live_tier` names (node, zone, cluster: the first holding a live backend; the
/// two agree, up to the `TIER_SCAN` bound described there), and within it the backend is uniform among the
/// live ones.
///
/// Fast path (nothing marked down, the common case): one random slot of the first non-empty tier; if it is
/// live, that is the answer, at the cost of one slot lookup. Slow path (the pick was marked down): each tier in
/// turn is scanned by `scan_tier`, the first with a live backend wins. Together that is exactly uniform: a
/// live slot of the first tier is taken with probability `1/len` directly plus `(down/len) * (1/live)` from
/// the scan, which sums to `1/live`.
#[inline(always)]
pub fn choose<B: Copy + Default>(
    fe: &FrontendValue,
    lookup: impl FnMut(u32) -> Slot<B>,
    random: impl FnMut() -> u32,
) -> Choice<B> {
    choose_with(fe, lookup, random, scan_tier)
}

/// `choose` with the slow path's scan of one tier given: `scan_tier`'s loop on the host, the same steps
/// (`Scan::step`) under `bpf_loop` in the BPF programs, where the verifier then explores a step once instead
/// of every turn of the loop (Linux 6.1's verifier went past its million instructions on sendmsg6 with the
/// loop).
#[inline(always)]
pub fn choose_with<B: Copy + Default, L: FnMut(u32) -> Slot<B>, R: FnMut() -> u32>(
    fe: &FrontendValue,
    mut lookup: L,
    mut random: R,
    mut scan: impl FnMut(TierRange, &mut L, &mut R) -> u32,
) -> Choice<B> {
    let Some(first_tier) = first_nonempty_tier(fe) else { return Choice::Empty };
    let first = fe.tiers[first_tier];
    match lookup(u32::from(first.start) + below(random(), u32::from(first.len))) {
        Slot::Live(backend) => {
            return Choice::Backend { tier: first_tier, backend };
        }
        Slot::Missing => return Choice::Error,
        Slot::Down(_) => {}
    }
    let mut tier = 0;
    while tier < TIER_COUNT {
        let range = fe.tiers[tier];
        if range.len != 0 {
            let found = scan(range, &mut lookup, &mut random);
            if found == SCAN_ERROR {
                return Choice::Error;
            }
            if found != SCAN_NONE {
                // Look the winner up again (the scan returns only its index, see `scan_tier`). It may have been
                // marked down in the meantime; it was live a moment ago, so take it anyway.
                return match lookup(found) {
                    Slot::Live(backend) | Slot::Down(backend) => Choice::Backend { tier, backend },
                    Slot::Missing => Choice::Error,
                };
            }
        }
        tier += 1;
    }
    Choice::Empty
}

/// sessionAffinity on top of `choose`: given its `choice` and the client's remembered backend `sticky` (its
/// affinity entry is fresh, the backend is not marked down and is a member of the frontend's current
/// generation: the caller checked) with its member entry, take the sticky backend if it is in the tier the
/// choice came from, which is the tier the topology rules select now (the first holding a live backend). Else
/// the choice stands. The second value says whether the sticky backend was taken (else the caller replaces
/// the entry with the choice).
///
/// Topology comes first: a client that fell back to a later tier while the earlier ones were down returns to
/// the first as soon as it has a live backend again. Run after `choose`, not instead of it: the data path then
/// holds one copy of the choice, whose cost the verifier explores once (an affinity path with its own choice
/// multiplied the verification time by ten), at the price of one slot lookup the sticky backend makes moot.
#[inline(always)]
pub fn keep_sticky<B: Copy>(choice: Choice<B>, sticky: Option<(B, MemberValue)>) -> (Choice<B>, bool) {
    match (choice, sticky) {
        (Choice::Backend { tier, .. }, Some((backend, member))) if member.in_tier(tier) => {
            (Choice::Backend { tier, backend }, true)
        }
        _ => (choice, false),
    }
}

/// Reservoir-sample one live slot among up to `TIER_SCAN` slots of `range`, from a random offset; returns its
/// index, `SCAN_NONE` or `SCAN_ERROR`.
///
/// Kept out of line and returning a plain index for the BPF verifier: it explores this function once per call
/// and only the return value flows back, so what it learned about this tier's length inside the loop does not
/// multiply the states it must explore for the next tier (inlined, three tiers of 16 slots exceed the
/// verifier's one million instructions).
///
/// Bounded: in a tier longer than `TIER_SCAN`, if the scanned window holds only backends marked down the scan
/// reports none although live ones may sit outside it. Marking down bridges the moments before the agent
/// re-plans, so this is a documented approximation.
#[inline(never)]
pub fn scan_tier<B: Copy>(
    range: TierRange,
    lookup: &mut impl FnMut(u32) -> Slot<B>,
    random: &mut impl FnMut() -> u32,
) -> u32 {
    let mut scan = Scan::new(range, random);
    let mut i: u32 = 0;
    while i < scan.turns() {
        if !scan.step(i, lookup, random) {
            break;
        }
        i += 1;
    }
    scan.result()
}

/// `scan_tier`'s state between its steps: the window's place and the reservoir sample so far. `repr(C)`,
/// plain and small (12 bytes): the BPF programs keep it on their stack for `bpf_loop`'s callback, in the
/// frame whose size Linux 6.1 adds to the callback's against its 512-byte limit.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Scan {
    start: u16,
    len: u16,
    offset: u16,
    seen: u16,
    picked: u32,
}

impl Scan {
    /// A scan of `range` from a random offset.
    #[inline(always)]
    pub fn new(range: TierRange, random: &mut impl FnMut() -> u32) -> Self {
        let offset = below(random(), u32::from(range.len)) as u16;
        Self { start: range.start, len: range.len, offset, seen: 0, picked: SCAN_NONE }
    }

    /// How many steps the scan takes: the tier's length, at most `TIER_SCAN`.
    #[inline(always)]
    #[must_use]
    pub fn turns(&self) -> u32 {
        let len = u32::from(self.len);
        if len < TIER_SCAN { len } else { TIER_SCAN }
    }

    /// Step `i` (`i < turns()`): look at the window's `i`-th slot and keep it with probability `1/seen` if it
    /// is live. `false` ends the scan: a missing slot (the result is then `SCAN_ERROR`) or `i` out of range.
    #[inline(always)]
    pub fn step<B>(
        &mut self,
        i: u32,
        lookup: &mut impl FnMut(u32) -> Slot<B>,
        random: &mut impl FnMut() -> u32,
    ) -> bool {
        if i >= self.turns() {
            return false;
        }
        let (start, len) = (u32::from(self.start), u32::from(self.len));
        let mut k = u32::from(self.offset) + i;
        if k >= len {
            k -= len;
        }
        match lookup(start + k) {
            Slot::Live(_) => {
                self.seen += 1;
                if below(random(), u32::from(self.seen)) == 0 {
                    self.picked = start + k;
                }
            }
            Slot::Missing => {
                self.picked = SCAN_ERROR;
                return false;
            }
            Slot::Down(_) => {}
        }
        true
    }

    /// The index picked, `SCAN_NONE` or `SCAN_ERROR`.
    #[inline(always)]
    #[must_use]
    pub fn result(&self) -> u32 {
        self.picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fe(node: (u16, u16), zone: (u16, u16), cluster: (u16, u16)) -> FrontendValue {
        let r = |(start, len)| TierRange { start, len };
        FrontendValue {
            key: crate::FrontendKey::default(),
            svc_id: 1,
            generation: 1,
            tiers: [r(node), r(zone), r(cluster)],
            flags: 0,
            affinity_timeout_s: 0,
            generation_tail: 1,
        }
    }

    /// A tiny deterministic generator so tests are repeatable.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 32) as u32
        }
    }

    /// slots: backend number per slot index; down: backend numbers marked down.
    fn run(fe: &FrontendValue, slots: &[u32], down: &[u32], rng: &mut Lcg) -> Choice<u32> {
        choose(
            fe,
            |i| match slots.get(i as usize) {
                None => Slot::Missing,
                Some(&b) if down.contains(&b) => Slot::Down(b),
                Some(&b) => Slot::Live(b),
            },
            || rng.next(),
        )
    }

    #[test]
    fn tier_choice_table() {
        struct Case {
            name: &'static str,
            fe: FrontendValue,
            down: &'static [u32],
            want_tier: Option<usize>,
        }
        // slots: 0 = node backend 10; 1..3 = zone backends 20, 21; 3..6 = cluster 10, 20, 30
        let slots = [10, 20, 21, 10, 20, 30];
        let f = fe((0, 1), (1, 2), (3, 3));
        let cases = [
            Case { name: "node tier wins when its backend is live", fe: f, down: &[], want_tier: Some(0) },
            Case { name: "node backend down -> zone tier", fe: f, down: &[10], want_tier: Some(1) },
            Case { name: "node and zone down -> cluster", fe: f, down: &[10, 20, 21], want_tier: Some(2) },
            Case { name: "everything down -> empty", fe: f, down: &[10, 20, 21, 30], want_tier: None },
            Case {
                name: "empty node tier is skipped",
                fe: fe((0, 0), (1, 2), (3, 3)),
                down: &[],
                want_tier: Some(1),
            },
            Case {
                name: "no tiers at all -> empty",
                fe: fe((0, 0), (0, 0), (0, 0)),
                down: &[],
                want_tier: None,
            },
        ];
        let mut rng = Lcg(7);
        for c in cases {
            for _ in 0..50 {
                let got = run(&c.fe, &slots, c.down, &mut rng);
                match (got, c.want_tier) {
                    (Choice::Backend { tier, backend }, Some(want)) => {
                        assert_eq!(tier, want, "{}", c.name);
                        assert!(!c.down.contains(&backend), "{}: picked a down backend", c.name);
                    }
                    (Choice::Empty, None) => {}
                    (other, want) => panic!("{}: got {other:?}, want tier {want:?}", c.name),
                }
            }
        }
    }

    #[test]
    fn missing_slot_is_an_internal_error_not_a_silent_skip() {
        let mut rng = Lcg(1);
        let got = run(&fe((0, 0), (0, 0), (0, 4)), &[1, 2], &[], &mut rng);
        // Half the random picks land on a missing slot (2 or 3): every run either picks a live one or errors.
        assert!(matches!(got, Choice::Backend { .. } | Choice::Error));
        let always_missing = run(&fe((0, 0), (0, 0), (5, 1)), &[1, 2], &[], &mut rng);
        assert_eq!(always_missing, Choice::Error);
    }

    #[test]
    fn choice_is_uniform_among_live_backends_with_some_down() {
        let slots: Vec<u32> = (0..8).collect();
        let f = fe((0, 0), (0, 0), (0, 8));
        let down = [1, 2, 5];
        let mut rng = Lcg(42);
        let mut hits = [0u32; 8];
        let n = 60_000;
        for _ in 0..n {
            match run(&f, &slots, &down, &mut rng) {
                Choice::Backend { backend, .. } => hits[backend as usize] += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        let expect = n / 5;
        for (b, &h) in hits.iter().enumerate() {
            if down.contains(&(b as u32)) {
                assert_eq!(h, 0, "down backend {b} was picked");
            } else {
                assert!(h.abs_diff(expect) < expect / 10, "backend {b}: {h} hits, expected ~{expect}");
            }
        }
    }

    #[test]
    fn long_tier_still_reaches_every_slot() {
        let slots: Vec<u32> = (0..100).collect();
        let f = fe((0, 0), (0, 0), (0, 100));
        let mut rng = Lcg(3);
        let mut seen = [false; 100];
        for _ in 0..5_000 {
            if let Choice::Backend { backend, .. } = run(&f, &slots, &[], &mut rng) {
                seen[backend as usize] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn first_live_tier_table() {
        struct Case {
            name: &'static str,
            tiers: [&'static [u32]; TIER_COUNT],
            down: &'static [u32],
            want: Option<usize>,
        }
        let cases = [
            Case {
                name: "node tier wins when it holds a live backend",
                tiers: [&[10], &[20], &[30]],
                down: &[],
                want: Some(TIER_NODE),
            },
            Case {
                name: "node backend down -> zone",
                tiers: [&[10], &[20], &[30]],
                down: &[10],
                want: Some(TIER_ZONE),
            },
            Case {
                name: "node and zone down -> cluster",
                tiers: [&[10], &[20, 21], &[10, 20, 30]],
                down: &[10, 20, 21],
                want: Some(TIER_CLUSTER),
            },
            Case {
                name: "one live backend among down ones keeps its tier",
                tiers: [&[10, 11, 12], &[20], &[30]],
                down: &[10, 12],
                want: Some(TIER_NODE),
            },
            Case {
                name: "empty tiers are skipped",
                tiers: [&[], &[], &[30]],
                down: &[],
                want: Some(TIER_CLUSTER),
            },
            Case {
                name: "everything down -> none",
                tiers: [&[10], &[20], &[10, 20]],
                down: &[10, 20],
                want: None,
            },
            Case { name: "no tiers at all -> none", tiers: [&[], &[], &[]], down: &[], want: None },
        ];
        for c in cases {
            assert_eq!(first_live_tier(c.tiers, |b| !c.down.contains(b)), c.want, "{}", c.name);
        }
    }

    #[test]
    fn choose_takes_its_backend_from_the_first_live_tier() {
        // slots: 0 = node backend 10; 1..3 = zone backends 20, 21; 3..6 = cluster 10, 20, 30
        let slots = [10, 20, 21, 10, 20, 30];
        let layouts = [fe((0, 1), (1, 2), (3, 3)), fe((0, 0), (1, 2), (3, 3)), fe((0, 0), (0, 0), (3, 3))];
        let backends = [10, 20, 21, 30];
        let mut rng = Lcg(11);
        for f in layouts {
            let tiers = f.tiers.map(|r| &slots[usize::from(r.start)..usize::from(r.start + r.len)]);
            // Every subset of backends marked down.
            for mask in 0..(1u32 << backends.len()) {
                let down: Vec<u32> = backends
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, &b)| b)
                    .collect();
                let want = first_live_tier(tiers, |b| !down.contains(b));
                for _ in 0..20 {
                    let got = match run(&f, &slots, &down, &mut rng) {
                        Choice::Backend { tier, .. } => Some(tier),
                        Choice::Empty => None,
                        Choice::Error => panic!("no slot is missing"),
                    };
                    assert_eq!(got, want, "tiers {:?}, down {down:?}", f.tiers);
                }
            }
        }
    }

    #[test]
    fn sticky_choice_table() {
        struct Case {
            name: &'static str,
            sticky: Option<(u32, MemberValue)>,
            down: &'static [u32],
            want: (Option<usize>, Option<u32>, bool),
        }
        // slots: 0 = node backend 10; 1..3 = zone backends 20, 21; 3..6 = cluster 10, 20, 30
        let slots = [10, 20, 21, 10, 20, 30];
        let f = fe((0, 1), (1, 2), (3, 3));
        let member = |tiers: u32| MemberValue { tiers };
        let cases = [
            Case {
                name: "sticky backend in the selected tier is taken",
                sticky: Some((10, member(0b101))),
                down: &[],
                want: (Some(TIER_NODE), Some(10), true),
            },
            Case {
                name: "sticky backend only in the cluster tier while the node tier is live: topology first",
                sticky: Some((30, member(0b100))),
                down: &[],
                want: (Some(TIER_NODE), Some(10), false),
            },
            Case {
                name: "sticky zone backend kept while the node tier stays down",
                sticky: Some((21, member(0b110))),
                down: &[10],
                want: (Some(TIER_ZONE), Some(21), true),
            },
            Case {
                name: "sticky cluster backend once node and zone are down",
                sticky: Some((30, member(0b100))),
                down: &[10, 20, 21],
                want: (Some(TIER_CLUSTER), Some(30), true),
            },
            Case {
                name: "no sticky backend: the normal choice",
                sticky: None,
                down: &[10],
                want: (Some(TIER_ZONE), None, false),
            },
        ];
        let mut rng = Lcg(5);
        for c in cases {
            for _ in 0..30 {
                let chosen = choose(
                    &f,
                    |i| match slots.get(i as usize) {
                        None => Slot::Missing,
                        Some(&b) if c.down.contains(&b) => Slot::Down(b),
                        Some(&b) => Slot::Live(b),
                    },
                    || rng.next(),
                );
                let (got, used) = keep_sticky(chosen, c.sticky);
                let Choice::Backend { tier, backend } = got else { panic!("{}: {got:?}", c.name) };
                assert_eq!(Some(tier), c.want.0, "{}", c.name);
                if let Some(b) = c.want.1 {
                    assert_eq!(backend, b, "{}", c.name);
                }
                assert_eq!(used, c.want.2, "{}", c.name);
            }
        }
    }
}
