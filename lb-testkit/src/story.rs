//! The story's own kubectl commands, as its operator ran them (the shell's quoting removed), for the tests
//! and the demo that replay them against the real API server.

/// The fix: `internalTrafficPolicy: Cluster` and `trafficDistribution: PreferSameNode` on `nginx-cache`.
pub const PATCH: [&str; 8] = [
    "patch",
    "svc",
    "nginx-cache",
    "-n",
    "booking",
    "--type=merge",
    "-p",
    r#"{"spec":{"internalTrafficPolicy":"Cluster","trafficDistribution":"PreferSameNode"}}"#,
];

/// The check of the hints: each endpoint's node beside its `forNodes` and `forZones` hints, one per line.
pub const HINTS: [&str; 8] = [
    "get",
    "endpointslice",
    "-n",
    "booking",
    "-l",
    "kubernetes.io/service-name=nginx-cache",
    "-o",
    r#"jsonpath={range .items[*].endpoints[*]}{.nodeName}{"\t"}{.hints.forNodes[*].name}{"\t"}{.hints.forZones[*].name}{"\n"}{end}"#,
];

/// The story's operator's access: get and list on Services and EndpointSlices in `booking`, nothing else
/// (the user `operator` of `ControlPlane::kubeconfig`).
pub const OPERATOR_READ: &str = "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\n\
    metadata: {name: read, namespace: booking}\n\
    rules:\n- apiGroups: [\"\", discovery.k8s.io]\n  resources: [services, endpointslices]\n  verbs: [get, list]\n\
    ---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
    metadata: {name: operator-read, namespace: booking}\n\
    roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: read}\n\
    subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: operator}]\n";
