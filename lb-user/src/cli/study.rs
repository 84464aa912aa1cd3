//! `tierlb study`: a scenario file, or a whole cluster (`--manifests DIR | --kube`) with its clients where
//! they are (a clients file, the agents' `status -o json`, their pinned counters, or uniform) and what-if
//! phases (`--drain`, `--crash`, `--roll`).
use std::{net::IpAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;

use super::input::{CliInput, FaceSource};
use crate::{
    datapath::{marks::parse_duration, pins},
    model::ObjKey,
    output::Output,
    source::manifests::ManifestDir,
    study::{
        clients::{self, Clients, CountedInstance},
        cluster::{Timings, WhatIf, find_service},
        survey::{self, SurveyOptions},
    },
};

/// `tierlb study`.
#[derive(clap::Args, Debug)]
pub struct StudyArgs {
    /// A scenario file (YAML); see examples/study/.
    #[arg(required_unless_present_any = ["models", "manifests", "kube"], conflicts_with_all = ["manifests", "kube"])]
    pub scenario: Option<PathBuf>,
    /// Print each proxy model instead: what it stands for (proxy and versions), its rule, what a client
    /// meets when its set is empty, and the code it was read from.
    #[arg(long, conflicts_with_all = ["chart", "scenario", "manifests", "kube"])]
    pub models: bool,
    /// Study every Service of a directory of Service, EndpointSlice and Node YAML (e.g. a `kubectl get
    /// svc,endpointslices,nodes -A -o yaml` dump), one scenario per Service as the objects are.
    #[arg(long, conflicts_with = "kube")]
    pub manifests: Option<PathBuf>,
    /// Study every Service of the cluster the API server holds (read-only lists, as `tierlb plan --kube`).
    #[arg(long)]
    pub kube: bool,
    /// Only the Services of this namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Only this Service (NAMESPACE/NAME).
    #[arg(long)]
    pub service: Option<String>,
    /// Where the clients are: a clients file (YAML: `nodes: {NODE: SHARE}`, `services: {NS/NAME: {NODE:
    /// SHARE}}`), or `tierlb status -o json` outputs of the nodes' agents (repeat the flag; merged: each
    /// Service's connects counted per node). Without it, or --clients-from: uniform over the nodes.
    #[arg(long, conflicts_with = "clients_from")]
    pub clients: Vec<PathBuf>,
    /// Read the clients from the agents' pinned counters under this --bpffs directory (every instance).
    #[arg(long)]
    pub clients_from: Option<PathBuf>,
    /// What-if: this node drained (its endpoints terminating for --grace, then gone for --startup).
    #[arg(long)]
    pub drain: Vec<String>,
    /// What-if: this pod crashed (NAMESPACE/POD or POD as its EndpointSlice's targetRef names it, or its
    /// IP): unseen by the control plane for --unseen, then not ready for --startup.
    #[arg(long)]
    pub crash: Vec<String>,
    /// What-if: every Service's pods replaced one node at a time, as a DaemonSet's rolling update does (per
    /// node: the old pod terminating for --grace, then gone with its replacement not ready for --startup).
    #[arg(long)]
    pub roll: bool,
    /// How long a terminating endpoint serves (terminationGracePeriodSeconds).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub grace: Duration,
    /// How long until a replacement is ready.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub startup: Duration,
    /// How long a crash goes unseen by the control plane (readiness periodSeconds x failureThreshold).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub unseen: Duration,
    /// Requests per second from all clients of a Service (how fast passive health learns a crash).
    #[arg(long, default_value_t = 100.0)]
    pub requests_per_second: f64,
    /// The summary names Services whose largest endpoint share under PreferSameNode is above this many times
    /// the even share.
    #[arg(long, default_value_t = 1.25)]
    pub max_skew: f64,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Also write an SVG chart: a panel per phase, a stacked bar per model (endpoint shares, failed, hang).
    /// Of a cluster, only with one Service (--service).
    #[arg(long)]
    pub chart: Option<PathBuf>,
}

impl StudyArgs {
    fn cluster_flags(&self) -> Vec<&'static str> {
        [
            (self.service.is_some(), "--service"),
            (!self.clients.is_empty(), "--clients"),
            (self.clients_from.is_some(), "--clients-from"),
            (!self.drain.is_empty(), "--drain"),
            (!self.crash.is_empty(), "--crash"),
            (self.roll, "--roll"),
            (self.namespace.is_some(), "--namespace"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

/// The pod `text` names (an IP, `NS/POD` or a POD unique among the slices' targetRefs) as its address.
fn crashed_ip(text: &str, pods: &std::collections::BTreeMap<IpAddr, ObjKey>) -> anyhow::Result<IpAddr> {
    if let Ok(ip) = text.parse() {
        return Ok(ip);
    }
    let found: Vec<(&IpAddr, &ObjKey)> = pods
        .iter()
        .filter(|(_, k)| match text.split_once('/') {
            Some((ns, name)) => k.namespace == ns && k.name == name,
            None => k.name == text,
        })
        .collect();
    match found.as_slice() {
        [(ip, _)] => Ok(**ip),
        [] => anyhow::bail!(
            "--crash {text}: no EndpointSlice endpoint names this pod in its targetRef (give NAMESPACE/POD, or \
             the pod's IP as `kubectl get pod -o wide` shows it)"
        ),
        more => anyhow::bail!(
            "--crash {text}: pods of this name in several namespaces ({}): write NAMESPACE/POD",
            more.iter().map(|(_, k)| k.namespace.as_str()).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The agents' counters of every instance pinned under `bpffs`, as their `status -o json` would give them.
fn pinned_clients(bpffs: &std::path::Path) -> anyhow::Result<Clients> {
    let mut instances = Vec::new();
    for (name, dir) in pins::instances(bpffs, None)? {
        let maps = crate::datapath::ebpf::KernelMaps::open_pinned(&dir)?;
        let inst = crate::status::Instance::read(&name, &maps, crate::datapath::marks::boottime_ns())?;
        let inst: CountedInstance = serde_json::from_value(serde_json::to_value(&inst)?)?;
        instances.push(inst);
    }
    anyhow::ensure!(
        !instances.is_empty(),
        "--clients-from {}: no agent instance is pinned there (check the agents' --bpffs)",
        bpffs.display()
    );
    Clients::counted(format!("from the pinned counters under {}", bpffs.display()), &instances)
}

/// `tierlb study`: the table or JSON, and the chart when asked.
pub fn run_study(args: &StudyArgs) -> anyhow::Result<String> {
    if args.manifests.is_some() || args.kube {
        return run_cluster(args);
    }
    let Some(scenario) = args.scenario.as_ref().filter(|_| !args.models) else {
        return Ok(match args.output {
            Output::Json => {
                let all: Vec<_> = crate::study::MODELS.iter().map(|m| m.info()).collect();
                serde_json::to_string_pretty(&all)? + "\n"
            }
            Output::Table => crate::study::models_text(),
        });
    };
    let flags = args.cluster_flags();
    anyhow::ensure!(
        flags.is_empty(),
        "{} study a cluster (--manifests DIR or --kube); a scenario file writes its own nodes, clients and phases",
        flags.join(", ")
    );
    let sc = crate::study::load(scenario)?;
    let r = crate::study::run(&sc);
    if let Some(path) = &args.chart {
        std::fs::write(path, crate::chart::study_chart(&r)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(match args.output {
        Output::Json => serde_json::to_string_pretty(&r)? + "\n",
        Output::Table => crate::study::table(&r),
    })
}

fn run_cluster(args: &StudyArgs) -> anyhow::Result<String> {
    anyhow::ensure!(
        args.requests_per_second.is_finite() && args.requests_per_second > 0.0,
        "--requests-per-second {}: give a rate above 0",
        args.requests_per_second
    );
    let source =
        FaceSource { manifests: args.manifests.clone(), kube: args.kube, namespace: args.namespace.clone() };
    study_on(args, &source.load(None)?)
}

/// `tierlb study` of a cluster read into `input` (`--manifests` or `--kube`).
pub fn study_on(args: &StudyArgs, input: &CliInput) -> anyhow::Result<String> {
    let clients = match &args.clients_from {
        Some(bpffs) => pinned_clients(bpffs)?,
        None => clients::load(&args.clients)?,
    };
    let only = args
        .service
        .as_deref()
        .map(|s| find_service(&input.model, s))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let mut what_ifs: Vec<WhatIf> = args.drain.iter().cloned().map(WhatIf::Drain).collect();
    if !args.crash.is_empty() {
        let pods = match &args.manifests {
            Some(dir) if args.crash.iter().any(|c| c.parse::<IpAddr>().is_err()) => ManifestDir::new(dir)
                .pod_refs()
                .with_context(|| format!("--manifests {}: reading the pods' names", dir.display()))?,
            _ => input.pods.clone(),
        };
        for c in &args.crash {
            what_ifs.push(WhatIf::Crash(crashed_ip(c, &pods)?));
        }
    }
    if args.roll {
        what_ifs.push(WhatIf::Roll);
    }
    for node in &args.drain {
        let known = input.model.nodes.contains_key(node)
            || input
                .model
                .slices
                .values()
                .flat_map(|s| &s.endpoints)
                .any(|e| e.node_name.as_ref() == Some(node));
        anyhow::ensure!(known, "--drain {node}: no Node and no endpoint of this name in {}", input.origin);
    }
    let opts = SurveyOptions {
        what_ifs,
        timings: Timings {
            grace_s: args.grace.as_secs_f64(),
            startup_s: args.startup.as_secs_f64(),
            unseen_s: args.unseen.as_secs_f64(),
        },
        requests_per_second: args.requests_per_second,
        max_skew: args.max_skew,
    };
    let c = survey::survey(&input.model, input.origin.clone(), only, &clients, &opts);
    if let Some(path) = &args.chart {
        let [one] = c.services.as_slice() else {
            anyhow::bail!(
                "--chart draws one Service and {} are studied: add --service NAMESPACE/NAME",
                c.services.len()
            );
        };
        std::fs::write(path, crate::chart::study_chart(&one.study)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(match args.output {
        Output::Json => serde_json::to_string_pretty(&c)? + "\n",
        Output::Table => crate::study::cluster_table(&c),
    })
}
