//! Where a one-shot face (`plan`, `explain`, `lint`) reads the cluster: a manifests directory, or the API
//! server read once (`--kube`: lists only, `source::kube::list`), and what both give the faces alike: the
//! valid objects with the controller's hints where slices carry none, the problems printed to stderr.
use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;

use crate::{
    model::{Model, ObjKey},
    source::{Diagnostic, Severity, kube::list, manifests::ManifestDir},
};

/// The source flags of `plan`, `explain` and `lint`.
#[derive(clap::Args, Debug, Clone)]
pub struct FaceSource {
    /// Service, EndpointSlice and Node YAML: a directory of files, one file (e.g. a `kubectl get
    /// svc,endpointslices,nodes -A -o yaml` dump), or `-` for standard input.
    #[arg(long, required_unless_present = "kube", conflicts_with = "kube")]
    pub manifests: Option<PathBuf>,
    /// Read the objects from the API server instead (in-cluster service account or KUBECONFIG), read-only:
    /// lists of Services, EndpointSlices and Nodes, no watch. Without permission to list Nodes it says so
    /// and goes on without them (zones from --zone or the endpoints).
    #[arg(long)]
    pub kube: bool,
    /// Only the Services of this namespace (with --kube, only this namespace is read: a namespace's
    /// read-only role is enough).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// With --kube: the kubeconfig file to use (default: the in-cluster service account, else KUBECONFIG or
    /// ~/.kube/config), as kubectl's --kubeconfig.
    #[arg(long, value_name = "FILE", requires = "kube")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kube: the kubeconfig context to use (default: its current-context), as kubectl's --context.
    #[arg(long, value_name = "NAME", requires = "kube")]
    pub context: Option<String>,
    /// Where a Service asks for hints (trafficDistribution, topology-mode) and its EndpointSlices carry none,
    /// plan with the hints the EndpointSlice controller would write, as the agent does (its metrics say
    /// `reason="hints_emulated"`), and label them so wherever they show. Without it the slices are shown as
    /// they are, as kube-proxy reads them.
    #[arg(long)]
    pub emulate_hints: bool,
}

/// How long `--kube` waits for the API server's answers.
pub const KUBE_TIMEOUT: Duration = Duration::from_mins(1);

/// The cluster as a one-shot command reads it: the model of its valid objects, with the controller's hints
/// where slices carry none, and how many problems made something not taken.
pub struct CliInput {
    /// The valid objects (invalid ones are left out).
    pub model: Model,
    /// Diagnostics of severity error: objects (or documents, or files) not taken as they are.
    pub errors: usize,
    /// Fields neither Kubernetes nor tierlb knows, ignored (`Diagnostic::is_unknown_field`): `lint` reports
    /// them as findings.
    pub unknown_fields: Vec<Diagnostic>,
    /// Services whose slices carried no hints and got the controller's (only with `--emulate-hints`).
    pub filled: Vec<ObjKey>,
    /// Services that ask for hints while their slices carry none, left as they are (without
    /// `--emulate-hints`): the agent plans them with the controller's hints.
    pub unhinted: Vec<ObjKey>,
    /// Where it was read, for messages: `--manifests DIR`, `the API server (namespace shop)`.
    pub origin: String,
    /// Addresses no frontend may take besides `--protect-address`: with `--kube`, the API server's, as the
    /// agent protects them.
    pub protected: Vec<std::net::SocketAddr>,
    /// With `--kube`, the pods the slices name, by address (`tierlb study --crash POD`); a manifests
    /// directory's are read on demand (`ManifestDir::pod_refs`).
    pub pods: std::collections::BTreeMap<std::net::IpAddr, ObjKey>,
}

impl CliInput {
    /// Say on stderr which Services' hints were emulated, or are missing and shown as they are (of `about`
    /// alone when given: `explain` answers for one Service).
    fn note_hints(&self, about: Option<&ObjKey>) {
        let asked = |svc: &&ObjKey| about.is_none_or(|k| k == *svc);
        for svc in self.filled.iter().filter(asked) {
            eprintln!(
                "note: EndpointSlices of Service {svc} carry no hints: planned with the hints the EndpointSlice \
                 controller would write (--emulate-hints), labelled \"emulated\" below"
            );
        }
        for svc in self.unhinted.iter().filter(asked) {
            eprintln!(
                "note: EndpointSlices of Service {svc} carry no hints although it asks for them: shown as they \
                 are (kube-proxy uses every endpoint); the agent plans it with the hints the EndpointSlice \
                 controller would write, which --emulate-hints shows"
            );
        }
    }

    /// Where Service `key`'s hints come from.
    pub fn hinted(&self, key: &ObjKey) -> crate::explain::Hinted {
        use crate::explain::Hinted;
        if self.filled.contains(key) {
            Hinted::Emulated
        } else if self.unhinted.contains(key) {
            Hinted::Missing
        } else {
            Hinted::AsWritten
        }
    }

    /// The node `args` names, as the agent would plan for it from this input (the API server's addresses
    /// protected with `--kube`).
    pub fn node(&self, args: &super::NodeArgs) -> crate::model::NodeInfo {
        self.node_named(&args.node, &args.site)
    }

    /// Node `name` with `site`'s zone and addresses, as `node`.
    pub fn node_named(&self, name: &str, site: &super::NodeSite) -> crate::model::NodeInfo {
        let mut node = site.resolve(name, &self.model);
        node.protected.extend(&self.protected);
        node
    }
}

impl FaceSource {
    /// Read the source (of `namespace`, which overrides `--namespace`: explain reads its Service's).
    pub fn load(&self, namespace: Option<&str>) -> anyhow::Result<CliInput> {
        self.load_about(namespace, None)
    }

    /// `load`, its notes on stderr about Service `about` alone when given (`explain`'s).
    pub fn load_about(&self, namespace: Option<&str>, about: Option<&ObjKey>) -> anyhow::Result<CliInput> {
        let namespace = namespace.or(self.namespace.as_deref());
        let mut input = match &self.manifests {
            Some(dir) => load_for_cli(dir, self.emulate_hints)?,
            None => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("--kube: cannot start the client's runtime")?
                .block_on(async {
                    let client = self.client().await?;
                    tokio::time::timeout(KUBE_TIMEOUT, kube_input(client, namespace, self.emulate_hints))
                        .await
                        .with_context(|| {
                            format!("--kube: the API server did not answer within {KUBE_TIMEOUT:?}")
                        })?
                })?,
        };
        if let Some(ns) = namespace {
            input.model.services.retain(|k, _| *k.namespace == *ns);
            input.filled.retain(|k| *k.namespace == *ns);
            input.unhinted.retain(|k| *k.namespace == *ns);
            // Said the same way whichever source was read.
            input.origin = format!("{} (namespace {ns})", input.origin);
        }
        input.note_hints(about);
        Ok(input)
    }
}

impl FaceSource {
    /// The API server's client: `--kubeconfig` and `--context` when given, else kube-rs's defaults (the
    /// in-cluster service account, else KUBECONFIG or ~/.kube/config).
    async fn client(&self) -> anyhow::Result<kube::Client> {
        let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                // Opened here first: kube-rs's own message quotes the path twice over (`'"/path"'`).
                std::fs::File::open(path)
                    .with_context(|| format!("--kubeconfig {}: cannot read it", path.display()))?;
                let file = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("--kubeconfig {}: not a kubeconfig", path.display()))?;
                kube::Config::from_custom_kubeconfig(file, &options)
                    .await
                    .with_context(|| format!("--kubeconfig {}", path.display()))?
            }
            (None, Some(context)) => kube::Config::from_kubeconfig(&options)
                .await
                .with_context(|| format!("--context {context}: not in KUBECONFIG or ~/.kube/config"))?,
            (None, None) => kube::Config::infer().await.map_err(|e| {
                anyhow::anyhow!(
                    "--kube: no cluster to read ({e}): no in-cluster service account, and KUBECONFIG or \
                     ~/.kube/config names none; pass --kubeconfig FILE, or use --manifests DIR"
                )
            })?,
        };
        kube::Client::try_from(config).context("--kube: cannot build the client")
    }
}

/// Read the API server once through `client` (of `namespace`, or every namespace) for a one-shot command,
/// printing its problems to stderr; a 403 on Nodes is said once and the command goes on without them.
pub async fn kube_input(
    client: kube::Client,
    namespace: Option<&str>,
    emulate_hints: bool,
) -> anyhow::Result<CliInput> {
    let snap = list::snapshot(client, namespace).await.context("--kube")?;
    if let Some(why) = &snap.nodes_forbidden {
        eprintln!(
            "note: --kube: may not list Nodes ({why}): going on without them; each node's zone comes from \
             --zone or from its endpoints' zone, and NodePorts are planned for no node address"
        );
    }
    let mut input = finish(snap.model, &snap.diagnostics, "the API server".to_owned(), emulate_hints);
    input.pods = snap.pods;
    Ok(input)
}

/// Load a manifests directory, one file or `-` (standard input) for a one-shot command, printing its problems
/// to stderr (`emulate_hints`: `FaceSource::emulate_hints`).
pub fn load_for_cli(dir: &std::path::Path, emulate_hints: bool) -> anyhow::Result<CliInput> {
    if dir == std::path::Path::new("-") {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("--manifests -: cannot read standard input")?;
        let loaded = crate::source::manifests::load_text(dir, &text);
        let origin = "--manifests - (standard input)".to_owned();
        let mut input = finish(loaded.model, &loaded.diagnostics, origin, emulate_hints);
        input.pods = crate::source::manifests::pod_refs_text(&text);
        return Ok(input);
    }
    if dir.is_file() {
        let text = std::fs::read_to_string(dir)
            .with_context(|| format!("--manifests {}: cannot read the file", dir.display()))?;
        let loaded = crate::source::manifests::load_text(dir, &text);
        let origin = format!("--manifests {}", dir.display());
        let mut input = finish(loaded.model, &loaded.diagnostics, origin, emulate_hints);
        input.pods = crate::source::manifests::pod_refs_text(&text);
        return Ok(input);
    }
    let mut md = ManifestDir::new(dir);
    let loaded =
        md.load().with_context(|| format!("--manifests {}: cannot read the directory", dir.display()))?;
    let mut input =
        finish(loaded.model, &loaded.diagnostics, format!("--manifests {}", dir.display()), emulate_hints);
    // Files that vanished since are passed over: the model is what was read.
    input.pods = md.pod_refs().unwrap_or_default();
    Ok(input)
}

/// Print the problems, give slices without hints the hints the EndpointSlice controller would write when
/// `emulate` (as the agent does, so `plan` shows what the agent programs) or name them, and count the errors.
fn finish(mut model: Model, diagnostics: &[Diagnostic], origin: String, emulate: bool) -> CliInput {
    for d in diagnostics {
        let level = if d.severity == Severity::Error { "error" } else { "warning" };
        eprintln!("{level}: {d}");
    }
    let (mut filled, mut unhinted) = (Vec::new(), Vec::new());
    if emulate {
        filled = crate::hints::fill_missing(&mut model);
    } else {
        unhinted = model
            .services
            .values()
            .filter(|s| crate::hints::fill_for(&model, s).is_some())
            .map(|s| s.key.clone())
            .collect();
    }
    let errors = diagnostics.iter().filter(|d| d.severity == Severity::Error).count();
    let unknown_fields = diagnostics.iter().filter(|d| d.is_unknown_field()).cloned().collect();
    CliInput {
        model,
        errors,
        unknown_fields,
        filled,
        unhinted,
        origin,
        protected: Vec::new(),
        pods: std::collections::BTreeMap::new(),
    }
}
