//! The agent's kube rows against the real API server: kube-apiserver v1.36.3 with etcd, built here from
//! Kubernetes' code (`lb_testkit::kube`), the Services and EndpointSlices created through it, the agent
//! reading it with the token of `deploy/rbac.yaml`'s service account from a node namespace linked to it, and
//! each edit made with `kubectl replace`.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::api::{Api, PostParams};
use lb_testkit::{
    kube::{ControlPlane, Options},
    sandbox::{NetNs, confine},
};
use serde_json::Value;

/// Creates in flight at once (well under the API server's default of 200 mutating requests in flight).
const IN_FLIGHT: usize = 32;

/// ClusterIPs of the bench's Services start at 10.96.0.10 and run past 10.96.0.0/16 from 65,526 Services on.
const SERVICE_CIDR: &str = "10.96.0.0/12";

/// The real API server with the bench's cluster in it, and the node namespace the agent runs in.
pub(super) struct RealApiServer {
    // Field order is drop order: the node's namespace, then the control plane.
    node: NetNs,
    /// The agent's kubeconfig: `kube-system/tierlb`'s token.
    pub kubeconfig: PathBuf,
    cp: ControlPlane,
}

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

impl RealApiServer {
    /// Start it, apply deploy/rbac.yaml, and create `docs` (Services, then EndpointSlices) through it.
    pub(super) fn start(docs: Vec<Value>) -> anyhow::Result<Self> {
        Self::start_with(docs, std::net::IpAddr::from([10, 0, 0, 1]), None)
    }

    /// As `start`, node-1's InternalIP `node_ip` (where kube-proxy serves node ports), the node ports
    /// `node_port_range` (`--service-node-port-range`) if given.
    pub(super) fn start_with(
        docs: Vec<Value>,
        node_ip: std::net::IpAddr,
        node_port_range: Option<&str>,
    ) -> anyhow::Result<Self> {
        let options = Options {
            service_cidr: Some(SERVICE_CIDR.to_owned()),
            node_port_range: node_port_range.map(str::to_owned),
        };
        let mut cp = ControlPlane::start("bench-k8s", options)?;
        cp.kubectl(&["apply", "-f", &deploy_dir().join("rbac.yaml").display().to_string()])?;
        let kubeconfig = cp.service_account_kubeconfig("kube-system", "tierlb")?;
        cp.add_node("node-1", None, node_ip)?;
        let node = NetNs::new("bench-node")?;
        cp.link(&node)?;
        let count = docs.len();
        let t = Instant::now();
        create_all(&cp, docs)?;
        let secs = t.elapsed().as_secs_f64();
        eprintln!(
            "bench: created {count} Services and EndpointSlices through the API server in {secs:.1} s ({:.0} a second, {IN_FLIGHT} in flight)",
            count as f64 / secs
        );
        Ok(Self { node, kubeconfig, cp })
    }

    /// Make `cmd` (the agent) run in the node's namespace with the service account's kubeconfig.
    pub(super) fn agent(&self, cmd: &mut Command) -> anyhow::Result<()> {
        cmd.arg("--kube").env("KUBECONFIG", &self.kubeconfig);
        confine(cmd, None, Some(&self.node))
    }

    /// Link `ns` to the API server (kube-proxy's rows run it in the bench's namespace).
    pub(super) fn link(&mut self, ns: &NetNs) -> anyhow::Result<()> {
        self.cp.link(ns).map(drop)
    }

    /// Real kube-proxy in `mode` for node-1 in `ns` (linked), once it has written its rules (within `limit`).
    pub(super) fn kube_proxy(
        &self,
        ns: &NetNs,
        mode: lb_testkit::kube_proxy::Mode,
        limit: std::time::Duration,
    ) -> anyhow::Result<lb_testkit::kube_proxy::KubeProxy> {
        use lb_testkit::kube_proxy::{HEALTHZ_PORT, KubeProxy, Launch, METRICS_PORT};
        let how = Launch {
            mode,
            healthz: std::net::SocketAddr::from(([127, 0, 0, 1], HEALTHZ_PORT)),
            metrics: std::net::SocketAddr::from(([127, 0, 0, 1], METRICS_PORT)),
            limit,
            release: None,
            verbosity: 2,
        };
        KubeProxy::launch(&self.cp, "node-1", ns, &how)
    }

    /// Replace an EndpointSlice with `kubectl replace -f -` (an unconditional update, as an operator's edit).
    pub(super) fn replace(&self, slice: &Value) -> anyhow::Result<()> {
        self.cp.kubectl_stdin(&["replace", "-f", "-"], &slice.to_string())?;
        Ok(())
    }
}

/// Create every object, Services first, `IN_FLIGHT` at a time, as `admin`, from a thread in the control
/// plane's namespace.
fn create_all(cp: &ControlPlane, docs: Vec<Value>) -> anyhow::Result<()> {
    let admin = cp.kubeconfig("admin");
    cp.netns.run(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async {
            let kubeconfig = kube::config::Kubeconfig::read_from(&admin)?;
            let config =
                kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                    .await?;
            let client = kube::Client::try_from(config)?;
            for kind in ["Service", "EndpointSlice"] {
                futures::stream::iter(docs.iter().filter(|d| d["kind"] == kind))
                    .map(|d| create(&client, d))
                    .buffer_unordered(IN_FLIGHT)
                    .try_collect::<Vec<()>>()
                    .await?;
            }
            anyhow::Ok(())
        })
    })
}

async fn create(client: &kube::Client, doc: &Value) -> anyhow::Result<()> {
    let ns = doc["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let pp = PostParams::default();
    match doc["kind"].as_str() {
        Some("Service") => {
            let svc: Service = serde_json::from_value(doc.clone())?;
            Api::<Service>::namespaced(client.clone(), ns).create(&pp, &svc).await.map(drop)
        }
        Some("EndpointSlice") => {
            let slice: EndpointSlice = serde_json::from_value(doc.clone())?;
            Api::<EndpointSlice>::namespaced(client.clone(), ns).create(&pp, &slice).await.map(drop)
        }
        other => anyhow::bail!("the bench creates Services and EndpointSlices, not {other:?}"),
    }
    .with_context(|| format!("creating {ns}/{name}"))
}
