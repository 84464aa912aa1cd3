//! External destinations (NodePorts, load-balancer IPs, externalIPs) for connects made on the node, as
//! kube-proxy 1.35's EXT chain routes them (`syncProxyRules`, pkg/proxy/iptables/proxier.go and
//! pkg/proxy/nftables/proxier.go): pods ("short-circuit pod traffic") and the node's own processes
//! ("short-circuit local traffic") both go to the cluster-policy endpoints; only traffic from outside the node
//! follows externalTrafficPolicy.
use tierlb::{
    model::node_addresses::Cidr,
    plan::{ExternalKind, NotTranslatedReason, SpecialAddress},
};

use super::*;

fn reachable(etp: Policy, itp: Policy) -> Service {
    let mut s = Service { internal_policy: itp, external_policy: etp, ..svc() };
    s.type_ = ServiceType::NodePort;
    s.ports[0].node_port = Some(30080);
    s
}

fn on_node(name: &str, zone: Option<&str>) -> NodeInfo {
    NodeInfo { node_port_addresses: vec!["10.0.0.1".parse().unwrap()], ..node(name, zone) }
}

#[test]
fn connects_made_on_the_node_get_the_cluster_set_whatever_the_traffic_policies() {
    struct X {
        name: &'static str,
        etp: Policy,
        itp: Policy,
        eps: Vec<E>,
        internal: &'static [&'static str],
        on_node: &'static [&'static str],
        on_node_tier: SelectedTier,
        outside: &'static [&'static str],
        outside_when_empty: Option<WhenEmpty>,
    }
    let both = || vec![e("10.1.0.1", "n1").zone("a"), e("10.2.0.1", "n2").zone("b")];
    let cases = [
        X {
            name: "Cluster/Cluster: everyone the cluster set",
            etp: Policy::Cluster,
            itp: Policy::Cluster,
            eps: both(),
            internal: &["10.1.0.1", "10.2.0.1"],
            on_node: &["10.1.0.1", "10.2.0.1"],
            on_node_tier: SelectedTier::Cluster,
            outside: &["10.1.0.1", "10.2.0.1"],
            outside_when_empty: None,
        },
        X {
            name: "ETP Local: from outside the local set, on the node short-circuited to the cluster set",
            etp: Policy::Local,
            itp: Policy::Cluster,
            eps: both(),
            internal: &["10.1.0.1", "10.2.0.1"],
            on_node: &["10.1.0.1", "10.2.0.1"],
            on_node_tier: SelectedTier::Cluster,
            outside: &["10.1.0.1"],
            outside_when_empty: None,
        },
        X {
            name: "ETP Local + ITP Local: the internal policy does not apply to external destinations",
            etp: Policy::Local,
            itp: Policy::Local,
            eps: both(),
            internal: &["10.1.0.1"],
            on_node: &["10.1.0.1", "10.2.0.1"],
            on_node_tier: SelectedTier::Cluster,
            outside: &["10.1.0.1"],
            outside_when_empty: None,
        },
        X {
            name: "ETP Local, no local endpoint: outside traffic dropped, connects on the node still served",
            etp: Policy::Local,
            itp: Policy::Cluster,
            eps: vec![e("10.2.0.1", "n2")],
            internal: &["10.2.0.1"],
            on_node: &["10.2.0.1"],
            on_node_tier: SelectedTier::Cluster,
            outside: &[],
            outside_when_empty: Some(WhenEmpty::Drop),
        },
        X {
            name: "ITP Local, ETP Cluster: ClusterIP local only, external destinations the cluster set",
            etp: Policy::Cluster,
            itp: Policy::Local,
            eps: both(),
            internal: &["10.1.0.1"],
            on_node: &["10.1.0.1", "10.2.0.1"],
            on_node_tier: SelectedTier::Cluster,
            outside: &["10.1.0.1", "10.2.0.1"],
            outside_when_empty: None,
        },
        X {
            name: "topology applies to connects on the node as to the cluster set (clusterEndpoints)",
            etp: Policy::Local,
            itp: Policy::Local,
            eps: vec![
                e("10.1.0.1", "n1").zone("a").zones(&["a"]),
                e("10.3.0.1", "n3").zone("a").zones(&["a"]),
                e("10.2.0.1", "n2").zone("b").zones(&["b"]),
            ],
            internal: &["10.1.0.1"],
            on_node: &["10.1.0.1", "10.3.0.1"],
            on_node_tier: SelectedTier::Zone,
            outside: &["10.1.0.1"],
            outside_when_empty: None,
        },
    ];
    for c in cases {
        let m = model(reachable(c.etp, c.itp), &c.eps);
        let p = plan::plan(&m, &on_node("n1", Some("a")));
        let s = &p.services[0];
        let x = s.external.as_ref().expect("a nodePort makes the port externally reachable");
        assert_eq!(ips(&s.internal.endpoints), c.internal, "{}: internal", c.name);
        assert_eq!(x.from_pods, x.from_node, "{}: pods and the node's processes alike", c.name);
        assert_eq!(ips(&x.from_node.endpoints), c.on_node, "{}: on the node", c.name);
        assert_eq!(x.from_node.selected_tier, c.on_node_tier, "{}", c.name);
        assert_eq!(x.from_node.policy, Policy::Cluster, "{}", c.name);
        assert_eq!(ips(&x.from_outside.endpoints), c.outside, "{}: from outside", c.name);
        assert_eq!(x.from_outside.when_empty, c.outside_when_empty, "{}", c.name);
    }
}

#[test]
fn external_frontends_are_node_ports_on_node_addresses_vip_mode_ingress_ips_and_allowed_external_ips() {
    let sock = |text: &str| text.parse::<SocketAddr>().unwrap();
    let ip = |text: &str| text.parse::<IpAddr>().unwrap();
    let mut service = reachable(Policy::Cluster, Policy::Cluster);
    service.type_ = ServiceType::LoadBalancer;
    service.load_balancer_ips = vec![ip("192.0.2.10"), ip("2001:db8::10")].into();
    service.load_balancer_proxy_ips = vec![ip("192.0.2.20")].into();
    service.external_ips = vec![ip("198.51.100.7"), ip("203.0.113.9"), ip("192.0.2.10")].into();
    let the_model = model(service, &[e("10.2.0.1", "n2")]);
    let the_node = NodeInfo {
        node_port_addresses: vec![ip("10.0.0.1"), ip("172.16.0.1"), ip("fd00::1")],
        external_ip_cidrs: Some(vec!["198.51.100.0/24".parse::<Cidr>().unwrap()]),
        ..node("n1", None)
    };
    let planned = plan::plan(&the_model, &the_node);
    let ext = planned.services[0].external.as_ref().unwrap();
    let got: Vec<(ExternalKind, SocketAddr)> = ext.frontends.iter().map(|f| (f.kind, f.addr)).collect();
    assert_eq!(
        got,
        [
            (ExternalKind::NodePort, sock("10.0.0.1:30080")),
            (ExternalKind::NodePort, sock("172.16.0.1:30080")),
            (ExternalKind::LoadBalancer, sock("192.0.2.10:80")),
            (ExternalKind::ExternalIp, sock("198.51.100.7:80")),
        ]
    );
    let skipped: Vec<(IpAddr, &NotTranslatedReason)> =
        ext.not_translated.iter().map(|t| (t.ip, &t.reason)).collect();
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(
        matches!(skipped[0], (a, NotTranslatedReason::OutsideExternalIpCidrs { .. }) if a == ip("203.0.113.9"))
    );
    assert!(
        matches!(skipped[1], (a, NotTranslatedReason::OutsideExternalIpCidrs { .. }) if a == ip("192.0.2.10")),
        "an externalIP outside the CIDRs is listed even when it is also the ingress IP (translated as that)"
    );
    assert_eq!(skipped[2], (ip("192.0.2.20"), &NotTranslatedReason::IpModeProxy));
    let text = tierlb::explain::explain(&the_model, &the_node, &ObjKey::new("default", "web")).unwrap();
    for want in [
        "node port 10.0.0.1:30080: translated",
        "load-balancer IP 192.0.2.20: NOT translated, ipMode Proxy",
        "external IP 203.0.113.9: NOT translated, outside --external-ip-cidrs (198.51.100.0/24)",
        "from pods and from the node's own processes",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
}

#[test]
fn only_proxy_mode_ingress_ips_do_not_make_a_port_externally_reachable() {
    // kube-proxy's ExternallyAccessible counts LoadBalancerVIPs, which leave out ipMode Proxy.
    let mut s = svc();
    s.load_balancer_proxy_ips = vec!["192.0.2.20".parse().unwrap()].into();
    let p = plan::plan(&model(s, &[e("10.2.0.1", "n2")]), &on_node("n1", None));
    assert!(p.services[0].external.is_none());
}

#[test]
fn an_external_ip_on_another_services_cluster_ip_is_not_programmed_whatever_the_names() {
    let mut m = model(svc(), &[e("10.2.0.1", "n2")]);
    // "aaa/evil" sorts before "default/web" and lists web's cluster IP as an externalIP (CVE-2020-8554).
    let evil = Service {
        key: ObjKey::new("aaa", "evil"),
        cluster_ips: vec!["10.96.0.66".parse().unwrap()].into(),
        external_ips: vec!["10.96.0.10".parse().unwrap()].into(),
        ..svc()
    };
    m.services.insert(evil.key.clone(), evil.into());
    let p = plan::plan(&m, &on_node("n1", None));
    let lints = lint::lint(&m, &on_node("n1", None), &p);
    let warning = |ns: &str| {
        let i = p.services.iter().position(|s| *s.name.service.namespace == *ns).unwrap();
        lints.ports[i].join("\n")
    };
    assert!(
        warning("aaa").contains("aaa/evil is NOT programmed there until default/web leaves it"),
        "{}",
        warning("aaa")
    );
    assert!(warning("default").contains("default/web is programmed"), "{}", warning("default"));
}

#[test]
fn special_addresses_are_loopback_unspecified_link_local_multicast_and_broadcast_in_both_families() {
    use SpecialAddress as S;
    // Which addresses are special, both families (an IPv4-mapped IPv6 address as its IPv4 address).
    let classes = [
        ("127.0.0.1", Some(S::Loopback)),
        ("127.8.9.10", Some(S::Loopback)),
        ("::1", Some(S::Loopback)),
        ("::ffff:127.0.0.1", Some(S::Loopback)),
        ("0.0.0.0", Some(S::Unspecified)),
        ("::", Some(S::Unspecified)),
        ("169.254.169.254", Some(S::LinkLocal)),
        ("fe80::1", Some(S::LinkLocal)),
        ("224.0.0.251", Some(S::Multicast)),
        ("ff02::1", Some(S::Multicast)),
        ("255.255.255.255", Some(S::Broadcast)),
        ("192.0.2.10", None),
        ("10.0.0.1", None),
        ("2001:db8::10", None),
    ];
    for (addr, want) in classes {
        assert_eq!(SpecialAddress::of(addr.parse().unwrap()), want, "{addr}");
    }
}

#[test]
fn addresses_that_are_not_a_services_to_take_are_never_translated() {
    struct X {
        name: &'static str,
        ingress: &'static str,
        reason: Option<NotTranslatedReason>,
        explain: &'static str,
    }
    use SpecialAddress as S;
    // Ingress IPs and externalIPs of every kind of refusal, beside one that is translated.
    let cases = [
        X {
            name: "loopback ingress IP (a pod's own 127.0.0.1:80 would reach the backend)",
            ingress: "127.0.0.1",
            reason: Some(NotTranslatedReason::Special { class: S::Loopback }),
            explain: "load-balancer IP 127.0.0.1: NOT translated, a loopback address",
        },
        X {
            name: "the metadata service",
            ingress: "169.254.169.254",
            reason: Some(NotTranslatedReason::Special { class: S::LinkLocal }),
            explain: "load-balancer IP 169.254.169.254: NOT translated, a link-local address",
        },
        X {
            name: "unspecified",
            ingress: "0.0.0.0",
            reason: Some(NotTranslatedReason::Special { class: S::Unspecified }),
            explain: "load-balancer IP 0.0.0.0: NOT translated, the unspecified address",
        },
        X {
            name: "the node's own address (its kubelet, its sshd)",
            ingress: "10.0.0.1",
            reason: Some(NotTranslatedReason::NodeAddress),
            explain: "load-balancer IP 10.0.0.1: NOT translated, one of this node's own addresses",
        },
        X {
            name: "the API server's address, which the agent connects to",
            ingress: "192.0.2.99",
            reason: Some(NotTranslatedReason::ApiServer { addr: "192.0.2.99:80".parse().unwrap() }),
            explain: "load-balancer IP 192.0.2.99: NOT translated, 192.0.2.99:80 is the API server's address",
        },
        X {
            name: "an ordinary ingress IP",
            ingress: "192.0.2.10",
            reason: None,
            explain: "load-balancer IP 192.0.2.10:80: translated",
        },
    ];
    for c in cases {
        let ip = c.ingress.parse::<IpAddr>().unwrap();
        for as_external_ip in [false, true] {
            let mut service = reachable(Policy::Cluster, Policy::Cluster);
            service.ports[0].node_port = None;
            service.type_ = ServiceType::LoadBalancer;
            if as_external_ip {
                service.external_ips = vec![ip].into();
            } else {
                service.load_balancer_ips = vec![ip].into();
            }
            let the_model = model(service, &[e("10.2.0.1", "n2")]);
            let the_node = NodeInfo {
                own_addresses: vec!["10.0.0.1".parse().unwrap()],
                protected: vec!["192.0.2.99:80".parse().unwrap()],
                ..node("n1", None)
            };
            let planned = plan::plan(&the_model, &the_node);
            let ext = planned.services[0].external.as_ref().unwrap();
            let kind = if as_external_ip { ExternalKind::ExternalIp } else { ExternalKind::LoadBalancer };
            let refused: Vec<_> =
                ext.not_translated.iter().map(|t| (t.kind, t.ip, t.reason.clone())).collect();
            if let Some(r) = &c.reason {
                assert_eq!(refused, [(kind, ip, r.clone())], "{}", c.name);
                assert!(ext.frontends.is_empty(), "{}: {:?}", c.name, ext.frontends);
            } else {
                assert!(refused.is_empty(), "{}: {refused:?}", c.name);
                assert_eq!(ext.frontends.len(), 1, "{}", c.name);
            }
            if !as_external_ip {
                let text =
                    tierlb::explain::explain(&the_model, &the_node, &ObjKey::new("default", "web")).unwrap();
                assert!(text.contains(c.explain), "{}: {:?} not in\n{text}", c.name, c.explain);
            }
        }
    }
}
