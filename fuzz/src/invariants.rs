//! The API server's rules restated on tierlb's model objects: what any object a source accepts must hold.
//! Written apart from `lb-user/src/source/validate` on purpose: a fuzz target that reused the validation
//! code could not find its mistakes.
use std::{collections::BTreeSet, net::IpAddr};

use tierlb::{
    model::{AddressType, EndpointSlice, Node, Service, ServiceType},
    source::Object,
};

/// Why an accepted object breaks a rule.
pub type Broken = String;

/// An address the API server refuses as an endpoint (`ValidateEndpointIP`) or that the data path cannot use
/// (IPv4-mapped IPv6).
fn special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => {
            a.is_unspecified() || a.is_loopback() || a.is_link_local() || a.octets()[..3] == [224, 0, 0]
        }
        IpAddr::V6(a) => {
            let s0 = a.segments()[0];
            a.is_unspecified()
                || a.is_loopback()
                || s0 & 0xffc0 == 0xfe80
                || s0 & 0xff0f == 0xff02
                || a.to_ipv4_mapped().is_some()
        }
    }
}

fn label(v: &str, letter_first: bool) -> bool {
    v.len() <= 63 && label_chars(v, letter_first)
}

fn label_chars(v: &str, letter_first: bool) -> bool {
    let b = v.as_bytes();
    !b.is_empty()
        && (if letter_first { b[0].is_ascii_lowercase() } else { b[0].is_ascii_alphanumeric() })
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

/// `IsDNS1123Subdomain`: 253 characters at most in all; its parts have no length limit of their own.
fn subdomain(v: &str) -> bool {
    v.len() <= 253 && v.split('.').all(|l| label_chars(l, false))
}

/// Check one accepted object.
pub fn check_object(o: &Object) -> Result<(), Broken> {
    match o {
        Object::Service(s) => service(s),
        Object::EndpointSlice(s) => slice(s),
        Object::Node(n) => node(n),
    }
}

fn service(s: &Service) -> Result<(), Broken> {
    if !label(&s.key.name, true) || !label(&s.key.namespace, false) {
        return Err(format!("bad name {}", s.key));
    }
    if s.cluster_ips.len() > 2 {
        return Err("more than two cluster IPs".into());
    }
    if s.cluster_ips.len() == 2 && s.cluster_ips[0].is_ipv4() == s.cluster_ips[1].is_ipv4() {
        return Err("two cluster IPs of one family".into());
    }
    if s.type_ == ServiceType::ExternalName && !s.cluster_ips.is_empty() {
        return Err("ExternalName with a cluster IP".into());
    }
    if let Some(ip) = s.cluster_ips.iter().chain(&s.external_ips).find(|ip| special(**ip)) {
        return Err(format!("special VIP {ip}"));
    }
    if !s.cluster_ips.is_empty() && s.ports.is_empty() {
        return Err("a VIP without ports".into());
    }
    let mut seen = BTreeSet::new();
    let mut names = BTreeSet::new();
    for p in &s.ports {
        if p.port == 0 || !seen.insert((p.port, p.protocol)) {
            return Err(format!("port {} repeated or zero", p.port));
        }
        if s.ports.len() > 1 && p.name.is_empty() {
            return Err("an unnamed port among several".into());
        }
        if !p.name.is_empty() && (!label(&p.name, false) || !names.insert(p.name.clone())) {
            return Err(format!("port name {:?} invalid or repeated", p.name));
        }
        if p.node_port == Some(0) {
            return Err("node port 0".into());
        }
    }
    Ok(())
}

fn slice(s: &EndpointSlice) -> Result<(), Broken> {
    if !subdomain(&s.key.name) || !label(&s.key.namespace, false) {
        return Err(format!("bad name {}", s.key));
    }
    if s.endpoints.len() > 1000 {
        return Err("more than 1000 endpoints".into());
    }
    let mut names = BTreeSet::new();
    for p in &s.ports {
        if p.port == 0 || !names.insert(p.name.clone()) {
            return Err(format!("slice port {:?} zero or repeated", p.name));
        }
    }
    for e in &s.endpoints {
        let want_v4 = match s.address_type {
            AddressType::IPv4 => true,
            AddressType::IPv6 => false,
            AddressType::Fqdn => continue,
        };
        let Some(ip) = e.address else { return Err("an IP endpoint without an address".into()) };
        if special(ip) || ip.is_ipv4() != want_v4 {
            return Err(format!("endpoint {ip} special or of the wrong family"));
        }
        if e.node_name.as_deref().is_some_and(|n| !subdomain(n)) {
            return Err("bad nodeName".into());
        }
        for hints in [e.hints.for_nodes(), e.hints.for_zones()].into_iter().flatten() {
            let distinct: BTreeSet<&tierlb::model::Name> = hints.iter().collect();
            if hints.len() > 8 || distinct.len() != hints.len() {
                return Err("too many or repeated hints".into());
            }
        }
    }
    Ok(())
}

fn node(n: &Node) -> Result<(), Broken> {
    if !subdomain(&n.name) {
        return Err(format!("bad Node name {:?}", n.name));
    }
    Ok(())
}
