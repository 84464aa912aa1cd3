//! `tierlb study`: a scenario file, or a whole cluster (`--manifests DIR | --kube`) with its clients where
//! they are (a clients file, the agents' `status -o json`, their pinned counters, or uniform) and what-if
//! phases (`--drain`, `--crash`, `--roll`).
use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;

use super::input::{CliInput, FaceSource};
use crate::{
    datapath::{marks::parse_span, pins},
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
    /// With --models: under the table, each model's full rule, its sources (repository, tag or commit,
    /// lines, pull requests) and how they were read.
    #[arg(long, requires = "models")]
    pub provenance: bool,
    /// Study every Service of Service, EndpointSlice and Node YAML: a directory of files, one file (e.g. a
    /// `kubectl get svc,endpointslices,nodes -A -o yaml` dump), or `-` for standard input; one scenario per
    /// Service as the objects are.
    #[arg(long, conflicts_with = "kube")]
    pub manifests: Option<PathBuf>,
    /// Study every Service of the cluster the API server holds (read-only lists, as `tierlb plan --kube`).
    #[arg(long)]
    pub kube: bool,
    /// Only the Services of this namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// With --kube: the kubeconfig file to use, as kubectl's --kubeconfig.
    #[arg(long, value_name = "FILE", requires = "kube")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kube: the kubeconfig context to use, as kubectl's --context.
    #[arg(long, value_name = "NAME", requires = "kube")]
    pub context: Option<String>,
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
    /// How long a terminating endpoint serves (terminationGracePeriodSeconds); default 30s.
    #[arg(long, value_parser = phase_length)]
    pub grace: Option<Duration>,
    /// How long until a replacement is ready; default 10s.
    #[arg(long, value_parser = phase_length)]
    pub startup: Option<Duration>,
    /// How long a crash goes unseen by the control plane (readiness periodSeconds x failureThreshold);
    /// default 30s.
    #[arg(long, value_parser = phase_length)]
    pub unseen: Option<Duration>,
    /// Requests per second from all clients of a Service (how fast passive health learns a crash); default
    /// 100.
    #[arg(long)]
    pub requests_per_second: Option<f64>,
    /// The summary names Services whose largest endpoint share under PreferSameNode is above this many times
    /// the even share; default 1.25.
    #[arg(long)]
    pub max_skew: Option<f64>,
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
            (self.grace.is_some(), "--grace"),
            (self.startup.is_some(), "--startup"),
            (self.unseen.is_some(), "--unseen"),
            (self.requests_per_second.is_some(), "--requests-per-second"),
            (self.max_skew.is_some(), "--max-skew"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

/// A what-if phase's length (`30s`, `2m`, `1m30s`): more than zero, at most a day.
fn phase_length(s: &str) -> Result<Duration, String> {
    let d = parse_span(s)?;
    if d.is_zero() || d > Duration::from_hours(24) {
        return Err(format!("{s:?}: a phase lasts more than 0 and at most 24h"));
    }
    Ok(d)
}

/// The pod `text` names (an IP of an endpoint, `NS/POD` or a POD unique among the slices' targetRefs): its
/// addresses (a dual-stack pod has one per family), checked against the endpoints of `m`.
fn crashed_pod(
    text: &str,
    pods: &BTreeMap<IpAddr, ObjKey>,
    m: &crate::model::Model,
) -> anyhow::Result<WhatIf> {
    if let Ok(ip) = text.parse::<IpAddr>() {
        let known = m.slices.values().flat_map(|s| &s.endpoints).any(|e| e.address == Some(ip));
        anyhow::ensure!(known, "--crash {text}: no EndpointSlice has an endpoint at this address");
        return Ok(WhatIf::Crash { pod: text.to_owned(), ips: vec![ip] });
    }
    let mut found: BTreeMap<&ObjKey, Vec<IpAddr>> = BTreeMap::new();
    for (ip, k) in pods {
        let hit = match text.split_once('/') {
            Some((ns, name)) => *k.namespace == *ns && *k.name == *name,
            None => *k.name == *text,
        };
        if hit {
            found.entry(k).or_default().push(*ip);
        }
    }
    let mut found = found.into_iter();
    match (found.next(), found.next()) {
        (Some((k, ips)), None) => Ok(WhatIf::Crash { pod: k.to_string(), ips }),
        (None, _) => anyhow::bail!(
            "--crash {text}: no EndpointSlice endpoint names this pod in its targetRef (give NAMESPACE/POD, or \
             the pod's IP as `kubectl get pod -o wide` shows it)"
        ),
        (Some((a, _)), Some((b, _))) => {
            let mut all = vec![a.namespace.clone(), b.namespace.clone()];
            all.extend(found.map(|(k, _)| k.namespace.clone()));
            anyhow::bail!(
                "--crash {text}: pods of this name in several namespaces ({}): write NAMESPACE/POD",
                all.join(", ")
            )
        }
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
    Clients::counted(format!("from the pinned counters under {}", bpffs.display()), &instances)
}

/// `tierlb study`: the table or JSON, and the chart when asked.
pub fn run_study(args: &StudyArgs) -> anyhow::Result<String> {
    if args.manifests.is_some() || args.kube {
        return run_cluster(args);
    }
    let Some(scenario) = args.scenario.as_ref().filter(|_| !args.models) else {
        let all: Vec<_> = crate::study::MODELS.iter().map(|m| m.info()).collect();
        return args.output.render(&all, |_| crate::study::models_text(args.provenance));
    };
    let flags = args.cluster_flags();
    anyhow::ensure!(
        flags.is_empty(),
        "{} {} only when studying a cluster (--manifests DIR or --kube): a scenario file writes its own nodes, \
         clients and phases",
        flags.join(", "),
        if flags.len() == 1 { "applies" } else { "apply" }
    );
    let sc = crate::study::load(scenario)?;
    let r = crate::study::run(&sc);
    if let Some(path) = &args.chart {
        std::fs::write(path, crate::chart::study_chart(&r)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    args.output.render(&r, |_| crate::study::table(&r))
}

fn run_cluster(args: &StudyArgs) -> anyhow::Result<String> {
    let source = FaceSource {
        manifests: args.manifests.clone(),
        kube: args.kube,
        namespace: args.namespace.clone(),
        kubeconfig: args.kubeconfig.clone(),
        context: args.context.clone(),
        // Labelled in each Service's study (`hints`): the models are compared on the hints the controller would write.
        emulate_hints: true,
    };
    study_on(args, &source.load(None)?)
}

/// `tierlb study` of a cluster read into `input` (`--manifests` or `--kube`).
pub fn study_on(args: &StudyArgs, input: &CliInput) -> anyhow::Result<String> {
    let rps = args.requests_per_second.unwrap_or(100.0);
    anyhow::ensure!(rps.is_finite() && rps > 0.0, "--requests-per-second {rps}: give a rate above 0");
    let max_skew = args.max_skew.unwrap_or(crate::lint::MAX_SKEW);
    anyhow::ensure!(max_skew.is_finite() && max_skew >= 1.0, "--max-skew {max_skew}: 1 (even) or more");
    let clients = match &args.clients_from {
        Some(bpffs) => pinned_clients(bpffs)?,
        None => clients::load(&args.clients)?,
    };
    let only = args
        .service
        .as_deref()
        .map(|s| find_service(&input.model, s, &input.origin))
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
            what_ifs.push(crashed_pod(c, &pods, &input.model)?);
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
                .any(|e| e.node_name.as_deref() == Some(node.as_str()));
        anyhow::ensure!(known, "--drain {node}: no Node and no endpoint of this name in {}", input.origin);
    }
    let defaults = Timings::default();
    let opts = SurveyOptions {
        what_ifs,
        timings: Timings {
            grace_s: args.grace.map_or(defaults.grace_s, |d| d.as_secs_f64()),
            startup_s: args.startup.map_or(defaults.startup_s, |d| d.as_secs_f64()),
            unseen_s: args.unseen.map_or(defaults.unseen_s, |d| d.as_secs_f64()),
        },
        requests_per_second: rps,
        max_skew,
        pods: input.pods.clone(),
    };
    let c = survey::survey(&input.model, input.origin.clone(), only, &input.filled, &clients, &opts);
    if let Some(path) = &args.chart {
        let [one] = c.services.as_slice() else {
            if let (Some(svc), [u]) = (&args.service, c.unstudied.as_slice()) {
                anyhow::bail!("--chart: {svc} is not studied ({}): nothing to draw", u.why);
            }
            anyhow::bail!(
                "--chart draws one Service and {} are studied: add --service NAMESPACE/NAME",
                c.services.len()
            );
        };
        std::fs::write(path, crate::chart::study_chart(&one.study)?)
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    args.output.render(&c, |_| crate::study::cluster_table(&c))
}
