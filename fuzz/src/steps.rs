//! The reconcile target's generator: libFuzzer's bytes (through `arbitrary`) as a run of applies, waits and
//! collections against maps of a generated size. Shared, as this one file, by the fuzz target
//! (`sequence.rs`, against `FakeMaps`) and by lb-user/tests/fake_vs_kernel.rs (`#[path]`: the fake and the
//! kernel's maps given the same runs), so it uses only what both crates have: `arbitrary`, `lb_common` and
//! `tierlb`.
use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use arbitrary::Arbitrary;
use lb_common::{Backend, PROTO_TCP, TIER_COUNT};
use tierlb::{
    datapath::{Desired, DesiredFrontend, addr},
    model::{ObjKey, ServicePortName},
};

/// The generated run.
#[derive(Arbitrary, Debug)]
pub struct Steps {
    max_services: u8,
    max_slots: u8,
    ops: Vec<Op>,
}

impl Steps {
    /// FRONTENDS' capacity (and the service ids): 1 to 16.
    pub fn max_services(&self) -> u32 {
        u32::from(self.max_services % 16) + 1
    }

    /// SLOTS' capacity in entries (`SLOT_BLOCK` slots each; a generated frontend takes up to 3), and MEMBERS':
    /// 1 to 24.
    pub fn max_slots(&self) -> u32 {
        u32::from(self.max_slots % 24) + 1
    }

    /// The first 24 operations.
    pub fn ops(&self) -> &[Op] {
        &self.ops[..self.ops.len().min(24)]
    }
}

/// One step.
#[derive(Arbitrary, Debug)]
pub enum Op {
    /// `apply` of everything.
    Apply(Vec<GenFrontend>),
    /// `apply_services` for these Services (the frontends of other Services are dropped from the list).
    ApplyServices(Vec<u8>, Vec<GenFrontend>),
    /// Time passes (milliseconds).
    Wait(u16),
    /// `collect_garbage` now.
    Collect,
}

/// One frontend as generated.
#[derive(Arbitrary, Debug)]
pub struct GenFrontend {
    vip: u8,
    port: u8,
    service: u8,
    tiers: [Vec<u8>; TIER_COUNT],
    flags: u8,
}

/// Service `i` of the four.
pub fn service(i: u8) -> ObjKey {
    ObjKey::new("ns", format!("s{}", i % 4))
}

/// The Services of an `ApplyServices` (up to four).
pub fn services(list: &[u8]) -> BTreeSet<ObjKey> {
    list.iter().take(4).map(|s| service(*s)).collect()
}

/// The desired frontends of a list (the first 12; only those of `only`'s Services when given): 8 VIPs, 3
/// ports, tiers of up to 6 of 16 backends, every other frontend with sessionAffinity.
pub fn desired(list: &[GenFrontend], only: Option<&BTreeSet<ObjKey>>) -> Desired {
    let mut d = Desired::new();
    for f in list.iter().take(12) {
        let svc = service(f.service);
        if only.is_some_and(|o| !o.contains(&svc)) {
            continue;
        }
        let backend = |h: &u8| {
            addr::backend(SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 244, 0, h % 16 + 1)), 8080), PROTO_TCP)
        };
        let tiers = f.tiers.each_ref().map(|t| t.iter().take(6).map(backend).collect::<Vec<Backend>>());
        d.insert(
            addr::frontend_key(
                IpAddr::V4(Ipv4Addr::new(10, 96, 0, f.vip % 8 + 1)),
                80 + u16::from(f.port % 3),
                PROTO_TCP,
            ),
            DesiredFrontend {
                name: Arc::new(ServicePortName::new(svc, "")),
                tiers,
                flags: u32::from(f.flags % 4),
                // Every other frontend with sessionAffinity, so member entries are written and buried too.
                affinity_timeout_s: if f.flags & 4 != 0 { 60 } else { 0 },
            },
        );
    }
    d
}
