//! Where a cluster study's clients are, per node: written in a clients file, counted by the agents (their
//! `tierlb status -o json`, one file per node or several merged), or uniform over the nodes when nothing says.
//! The skew PreferSameNode gives depends on exactly this (the story's 65/35 comes from clients 50/30/20), so
//! the study says for every Service which of these it used.
//!
//! A clients file (YAML) gives shares in any unit, for every Service and per Service:
//!
//! ```yaml
//! nodes: {node-1: 50, node-2: 30, node-3: 20}
//! services:
//!   booking/pdf-resume: {node-1: 10, node-2: 90}
//! ```
//!
//! An agent's counters are its frontends' connects since its maps were made (translated in any tier, refused,
//! dropped or let through), summed per Service over its ports, families and addresses: how many connects that
//! node's clients made to the Service. Files of several agents are added as written, node by node.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    path::{Path, PathBuf},
};

use serde::Deserialize;

use crate::{datapath::Counters, model::ObjKey};

/// A clients file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientsFile {
    /// Shares per node for every Service not in `services`.
    #[serde(default)]
    nodes: BTreeMap<String, f64>,
    /// Shares per node of one Service (`NAMESPACE/NAME`).
    #[serde(default)]
    services: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The part of one agent instance's `tierlb status -o json` the study reads.
#[derive(Clone, Debug, Deserialize)]
pub struct CountedInstance {
    /// The instance's name.
    pub instance: String,
    /// The node its agent runs on (written by the agent into its maps at start).
    #[serde(default)]
    pub node: Option<String>,
    /// Its frontends.
    pub frontends: Vec<CountedFrontend>,
}

/// One frontend of a [`CountedInstance`].
#[derive(Clone, Debug, Deserialize)]
pub struct CountedFrontend {
    /// `NAMESPACE/NAME` of its Service.
    pub service: String,
    /// "connect" (the node's own clients) or "outside" (traffic from other machines, not a client here).
    pub scope: String,
    /// Its connect counters.
    pub connections: Counters,
}

/// Where the clients are.
#[derive(Clone, Debug, Default)]
pub enum Clients {
    /// Nothing says: the same share on every node.
    #[default]
    Uniform,
    /// A clients file.
    Given {
        /// The file.
        origin: String,
        /// Shares for every Service.
        nodes: BTreeMap<String, f64>,
        /// Shares of single Services.
        services: BTreeMap<ObjKey, BTreeMap<String, f64>>,
    },
    /// The agents' counters.
    Counted {
        /// Where they were read (files, or the pinned maps).
        origin: String,
        /// The nodes whose agents were read.
        nodes: BTreeSet<String>,
        /// Connects per Service, per node.
        counts: BTreeMap<ObjKey, BTreeMap<String, u64>>,
    },
}

/// One Service's client shares and where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Shares {
    /// Share per node (summing to 1 unless no node has clients).
    pub per_node: BTreeMap<String, f64>,
    /// What they are: "uniform over 3 nodes: no --clients", "counted: ...".
    pub source: String,
}

fn normalised(m: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    let total: f64 = m.values().sum();
    m.iter().map(|(n, v)| (n.clone(), if total > 0.0 { v / total } else { 0.0 })).collect()
}

fn uniform(nodes: &[String], why: &str) -> Shares {
    let each = 1.0 / nodes.len().max(1) as f64;
    Shares {
        per_node: nodes.iter().map(|n| (n.clone(), each)).collect(),
        source: format!("uniform over {} nodes: {why}", nodes.len()),
    }
}

impl Clients {
    /// The client shares of Service `svc` in a cluster of `nodes`.
    pub fn shares(&self, svc: &ObjKey, nodes: &[String]) -> Shares {
        match self {
            Self::Uniform => uniform(nodes, "no --clients"),
            Self::Given { origin, nodes: all, services } => match services.get(svc) {
                Some(own) => {
                    Shares { per_node: normalised(own), source: format!("{origin}, for this Service") }
                }
                None if all.is_empty() => uniform(nodes, &format!("{origin} gives none for it")),
                None => Shares { per_node: normalised(all), source: format!("{origin}, for every Service") },
            },
            Self::Counted { origin, nodes: read, counts } => {
                let Some(c) = counts.get(svc).filter(|c| c.values().sum::<u64>() > 0) else {
                    return uniform(
                        nodes,
                        &format!("the agents of {} nodes counted no connect to it", read.len()),
                    );
                };
                let total: u64 = c.values().sum();
                let per_node = read
                    .iter()
                    .map(|n| (n.clone(), c.get(n).copied().unwrap_or(0) as f64 / total as f64))
                    .collect();
                let by: Vec<String> = c.iter().map(|(n, v)| format!("{n} {v}")).collect();
                let mut source = format!("counted: {total} connects ({}), {origin}", by.join(", "));
                let unread: Vec<&str> =
                    nodes.iter().filter(|n| !read.contains(*n)).map(String::as_str).collect();
                if !unread.is_empty() {
                    let _ = write!(source, "; no agent read on {} (taken as no clients)", unread.join(", "));
                }
                Shares { per_node, source }
            }
        }
    }

    /// The agents' counters of `instances`, read from `origin`; an instance that names no node is an error.
    pub fn counted(origin: String, instances: &[CountedInstance]) -> anyhow::Result<Self> {
        let mut nodes = BTreeSet::new();
        let mut counts: BTreeMap<ObjKey, BTreeMap<String, u64>> = BTreeMap::new();
        for inst in instances {
            let node = inst.node.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
                anyhow::anyhow!(
                    "{origin}: instance {:?} names no node (its agent is older than this tierlb, which writes \
                     its node into the maps at start): restart it with this version, or write the shares in \
                     a clients file (--clients FILE.yaml)",
                    inst.instance
                )
            })?;
            nodes.insert(node.clone());
            for f in inst.frontends.iter().filter(|f| f.scope == "connect") {
                let Some((ns, name)) = f.service.split_once('/') else { continue };
                *counts.entry(ObjKey::new(ns, name)).or_default().entry(node.clone()).or_default() +=
                    f.connections.total();
            }
        }
        Ok(Self::Counted { origin, nodes, counts })
    }

    /// The nodes a source names (the study adds them to the cluster's).
    pub fn nodes(&self) -> Vec<String> {
        match self {
            Self::Uniform => Vec::new(),
            Self::Given { nodes, services, .. } => {
                let mut all: BTreeSet<&String> = nodes.keys().collect();
                all.extend(services.values().flat_map(BTreeMap::keys));
                all.into_iter().cloned().collect()
            }
            Self::Counted { nodes, .. } => nodes.iter().cloned().collect(),
        }
    }
}

/// The instances of a `tierlb status -o json` output; `None` if the text is no such output (a clients file).
fn status_instances(path: &Path, text: &str) -> anyhow::Result<Option<Vec<CountedInstance>>> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else { return Ok(None) };
    let looks = |o: &serde_json::Value| o.get("instance").is_some() || o.get("frontends").is_some();
    let list = match &v {
        serde_json::Value::Array(items) if items.iter().all(looks) => true,
        o if looks(o) => false,
        _ => return Ok(None),
    };
    let parsed = if list {
        serde_json::from_value::<Vec<CountedInstance>>(v)
    } else {
        serde_json::from_value::<CountedInstance>(v).map(|i| vec![i])
    };
    parsed.map(Some).map_err(|e| {
        anyhow::anyhow!(
            "--clients {}: not a `tierlb status -o json` output this tierlb reads: {e}",
            path.display()
        )
    })
}

/// Read `--clients` files: one clients file, or any number of `tierlb status -o json` outputs (merged).
pub fn load(paths: &[PathBuf]) -> anyhow::Result<Clients> {
    if paths.is_empty() {
        return Ok(Clients::Uniform);
    }
    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("--clients {}: {e}", p.display()));
    let mut instances = Vec::new();
    let mut given = Vec::new();
    for p in paths {
        let text = read(p)?;
        match status_instances(p, &text)? {
            Some(mut i) => instances.append(&mut i),
            None => given.push((p, text)),
        }
    }
    let names = |ps: &[PathBuf]| ps.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ");
    match (given.as_slice(), instances.is_empty()) {
        ([], _) => Clients::counted(format!("from {}", names(paths)), &instances),
        ([(p, text)], true) => {
            let f: ClientsFile = crate::source::yaml::typed(text).map_err(|(field, e)| {
                anyhow::anyhow!(
                    "--clients {}: field {field}: {e} (a clients file has `nodes: {{NODE: SHARE}}` and \
                     `services: {{NS/NAME: {{NODE: SHARE}}}}`; or give `tierlb status -o json` outputs)",
                    p.display(),
                )
            })?;
            let mut services = BTreeMap::new();
            for (k, v) in f.services {
                let Some((ns, name)) = k.split_once('/') else {
                    anyhow::bail!("--clients {}: services: {k:?} is not NAMESPACE/NAME", p.display());
                };
                services.insert(ObjKey::new(ns, name), v);
            }
            for (n, v) in f.nodes.iter().chain(services.values().flatten()) {
                anyhow::ensure!(
                    v.is_finite() && *v >= 0.0,
                    "--clients {}: node {n}: share {v} (a share is a number of clients, 0 or more)",
                    p.display()
                );
            }
            let sums = std::iter::once(("nodes".to_owned(), &f.nodes))
                .filter(|(_, m)| !m.is_empty())
                .chain(services.iter().map(|(k, m)| (format!("services: {k}"), m)));
            for (what, m) in sums {
                anyhow::ensure!(
                    m.values().sum::<f64>() > 0.0,
                    "--clients {}: {what}: the shares add up to 0 (give some node clients)",
                    p.display()
                );
            }
            Ok(Clients::Given { origin: format!("from {}", p.display()), nodes: f.nodes, services })
        }
        _ => anyhow::bail!(
            "--clients: give one clients file, or `tierlb status -o json` outputs only ({} are clients files)",
            given.iter().map(|(p, _)| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}
