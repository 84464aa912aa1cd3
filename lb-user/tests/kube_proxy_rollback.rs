//! Back to kube-proxy and a canary node, against the real API server: kube-proxy's DaemonSet and ConfigMap (as
//! kubeadm makes them), saved with the guide's `kubectl get -o yaml` before the install deletes both, come back
//! with `kubectl apply -f` as they were; deploy/kube-proxy/cleanup.yaml passes the API server's validation; and
//! the canary component and kube-proxy patch of deploy/canary do what deploy/README.md says.
use std::path::Path;

use lb_testkit::{
    kube::{ControlPlane, Options},
    sandbox::TempDir,
};

/// kube-proxy as kubeadm v1.36 installs it (its addon's DaemonSet and ConfigMap, cmd/kubeadm/app/phases/addons/
/// proxy/manifests.go), with the service account the DaemonSet names.
const KUBEADM_KUBE_PROXY: &str = r"
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {app: kube-proxy}
data:
  config.conf: |
    apiVersion: kubeproxy.config.k8s.io/v1alpha1
    kind: KubeProxyConfiguration
    clusterCIDR: 10.244.0.0/16
    mode: nftables
  kubeconfig.conf: |
    apiVersion: v1
    kind: Config
    clusters:
    - cluster:
        certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
        server: https://192.0.2.10:6443
      name: default
    contexts:
    - context: {cluster: default, namespace: default, user: default}
      name: default
    current-context: default
    users:
    - name: default
      user:
        tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-proxy
  namespace: kube-system
  labels: {k8s-app: kube-proxy}
spec:
  selector:
    matchLabels: {k8s-app: kube-proxy}
  updateStrategy: {type: RollingUpdate}
  template:
    metadata:
      labels: {k8s-app: kube-proxy}
    spec:
      priorityClassName: system-node-critical
      containers:
        - name: kube-proxy
          image: registry.k8s.io/kube-proxy:v1.36.3
          imagePullPolicy: IfNotPresent
          command: [/usr/local/bin/kube-proxy, --config=/var/lib/kube-proxy/config.conf, --hostname-override=$(NODE_NAME)]
          securityContext: {privileged: true}
          volumeMounts:
            - {mountPath: /var/lib/kube-proxy, name: kube-proxy}
            - {mountPath: /run/xtables.lock, name: xtables-lock, readOnly: false}
            - {mountPath: /lib/modules, name: lib-modules, readOnly: true}
          env:
            - name: NODE_NAME
              valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
      hostNetwork: true
      serviceAccountName: kube-proxy
      volumes:
        - {name: kube-proxy, configMap: {name: kube-proxy}}
        - {name: xtables-lock, hostPath: {path: /run/xtables.lock, type: FileOrCreate}}
        - {name: lib-modules, hostPath: {path: /lib/modules}}
      tolerations:
        - operator: Exists
      nodeSelector: {kubernetes.io/os: linux}
";

#[test]
fn kube_proxy_saved_with_kubectl_comes_back_with_kubectl_apply_after_the_install_deleted_it() {
    let cp = ControlPlane::start("kp-back", Options::default()).unwrap();
    cp.apply(KUBEADM_KUBE_PROXY).unwrap();
    let spec =
        |what: &str| cp.kubectl(&["-n", "kube-system", "get", what, "kube-proxy", "-o", "jsonpath={.spec}"]);
    let data = || cp.kubectl(&["-n", "kube-system", "get", "cm", "kube-proxy", "-o", "jsonpath={.data}"]);
    let (ds_before, cm_before) = (spec("ds").unwrap(), data().unwrap());

    // Install step 3 as deploy/README.md writes it: both saved to a file, then both deleted (the ConfigMap too,
    // so that `kubeadm upgrade apply` leaves kube-proxy out).
    let saved =
        cp.kubectl(&["-n", "kube-system", "get", "daemonset,configmap", "kube-proxy", "-o", "yaml"]).unwrap();
    let dir = TempDir::new("kp-back").unwrap();
    let file = dir.path().join("kube-proxy-saved.yaml");
    std::fs::write(&file, &saved).unwrap();
    cp.kubectl(&["-n", "kube-system", "delete", "daemonset,configmap", "kube-proxy"]).unwrap();
    assert!(spec("ds").is_err() && data().is_err(), "both gone");

    // Back to kube-proxy: the saved file applied; the DaemonSet's spec and the ConfigMap's data as they were
    // (the uid, resourceVersion and status the file holds from the deleted objects do not stop a create).
    let out = cp.kubectl(&["apply", "-f", file.to_str().unwrap()]).unwrap();
    assert!(
        out.contains("daemonset.apps/kube-proxy created") && out.contains("configmap/kube-proxy created"),
        "{out}"
    );
    assert_eq!(spec("ds").unwrap(), ds_before, "the DaemonSet's spec restored");
    assert_eq!(data().unwrap(), cm_before, "the ConfigMap's data restored");

    // The cleanup DaemonSet of deploy/kube-proxy passes the API server's validation.
    let cleanup = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kube-proxy/cleanup.yaml");
    let out = cp.kubectl(&["apply", "--dry-run=server", "-f", cleanup.to_str().unwrap()]).unwrap();
    assert!(out.contains("daemonset.apps/kube-proxy-cleanup created (server dry run)"), "{out}");
}

/// A canary node, against the real API server: deploy/ with its `canary` component listed (the one line
/// deploy/README.md has the user uncomment) puts the agent on labelled nodes only, and the patch of
/// deploy/canary keeps kube-proxy off those nodes only; undone as the guide says, kube-proxy's spec is as before.
#[test]
fn a_canary_node_runs_the_agent_and_kube_proxy_is_kept_off_it_alone() {
    let cp = ControlPlane::start("kp-canary", Options::default()).unwrap();
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let dir = TempDir::new("kp-canary").unwrap();
    let copy = dir.path().join("deploy");
    let st = std::process::Command::new("cp").arg("-r").arg(&deploy).arg(&copy).status().unwrap();
    assert!(st.success());
    let kustomization = copy.join("kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization).unwrap();
    assert!(text.contains("\n  # - canary\n"), "deploy/kustomization.yaml offers the canary line:\n{text}");
    std::fs::write(&kustomization, text.replace("\n  # - canary\n", "\n  - canary\n")).unwrap();
    let out = cp.kubectl(&["apply", "--dry-run=server", "-o", "json", "-k", copy.to_str().unwrap()]).unwrap();
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ds =
        list["items"].as_array().unwrap().iter().find(|o| o["kind"] == "DaemonSet").expect("the DaemonSet");
    assert_eq!(
        ds["spec"]["template"]["spec"]["nodeSelector"],
        serde_json::json!({"tierlb.io/canary": "true"})
    );

    cp.apply(KUBEADM_KUBE_PROXY).unwrap();
    let spec = || cp.kubectl(&["-n", "kube-system", "get", "ds", "kube-proxy", "-o", "jsonpath={.spec}"]);
    let before = spec().unwrap();
    let patch = deploy.join("canary/kube-proxy-off-canary.yaml");
    let ns = ["-n", "kube-system"];
    cp.kubectl(
        &[&ns[..], &["patch", "daemonset", "kube-proxy", "--patch-file", patch.to_str().unwrap()]].concat(),
    )
    .unwrap();
    let affinity = cp
        .kubectl(&[
            "-n",
            "kube-system",
            "get",
            "ds",
            "kube-proxy",
            "-o",
            "jsonpath={.spec.template.spec.affinity}",
        ])
        .unwrap();
    assert!(
        affinity.contains(r#""key":"tierlb.io/canary","operator":"DoesNotExist""#),
        "kube-proxy off labelled nodes only: {affinity}"
    );
    let undo = r#"[{"op": "remove", "path": "/spec/template/spec/affinity"}]"#;
    cp.kubectl(&["-n", "kube-system", "patch", "daemonset", "kube-proxy", "--type", "json", "-p", undo])
        .unwrap();
    assert_eq!(spec().unwrap(), before, "undone, kube-proxy's spec is as it was");
}
