//! The API server's name, label and IP rules (k8s.io/apimachinery/pkg/util/validation and
//! pkg/apis/core/validation), each returning what is wrong as a message that says how to fix it.
use std::net::IpAddr;

/// `IsDNS1123Label`: at most 63 characters, lower-case alphanumerics and '-', alphanumeric at both ends.
pub(super) fn dns1123_label(value: &str) -> Result<(), String> {
    label_rule(value, false)
}

/// `IsDNS1035Label` (Service names): a DNS-1123 label that starts with a letter.
pub(super) fn dns1035_label(value: &str) -> Result<(), String> {
    label_rule(value, true)
}

fn label_rule(value: &str, letter_first: bool) -> Result<(), String> {
    if value.len() > 63 {
        return Err(format!("{value:?} is longer than 63 characters"));
    }
    if !is_label(value, letter_first) {
        let (kind, start, example) = if letter_first {
            ("DNS-1035", "a letter", "\"my-service\"")
        } else {
            ("DNS-1123", "a letter or digit", "\"http\", \"dns-tcp\"")
        };
        return Err(format!(
            "{value:?} is not a {kind} label: use lower-case letters, digits and '-', starting with {start} \
             and ending with a letter or digit (e.g. {example})"
        ));
    }
    Ok(())
}

/// `IsDNS1123Subdomain` (EndpointSlice and Node names, `ValidateNodeName`): at most 253 characters, DNS-1123
/// labels joined by '.'.
pub(super) fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.len() > 253 {
        return Err(format!("{value:?} is longer than 253 characters"));
    }
    if value.is_empty() || !value.split('.').all(|l| is_label(l, false)) {
        return Err(format!(
            "{value:?} is not a DNS-1123 subdomain: use lower-case letters, digits, '-' and '.', starting \
             and ending with a letter or digit (e.g. \"node-1.example\")"
        ));
    }
    Ok(())
}

/// `IsValidLabelValue`: empty, or at most 63 characters of alphanumerics, '-', '_' and '.', alphanumeric at
/// both ends.
pub(super) fn label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        return Err(format!("{value:?} is longer than 63 characters"));
    }
    let bytes = value.as_bytes();
    let ok = bytes.is_empty()
        || (bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')));
    if !ok {
        return Err(format!(
            "{value:?} is not a valid label value: use letters, digits, '-', '_' and '.', starting and \
             ending with a letter or digit (e.g. \"zone-a\")"
        ));
    }
    Ok(())
}

fn is_label(value: &str, letter_first: bool) -> bool {
    let b = value.as_bytes();
    let (Some(first), Some(last)) = (b.first(), b.last()) else { return false };
    let first_ok = if letter_first { first.is_ascii_lowercase() } else { is_lower_alnum(*first) };
    first_ok && is_lower_alnum(*last) && b.iter().all(|c| is_lower_alnum(*c) || *c == b'-')
}

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// An IP address as the API server parses new objects since Kubernetes 1.33 (`IsValidIPForLegacyField`
/// with `StrictIPCIDRValidation`): no leading zeros (Rust's parser rejects them too), no zone, and no
/// IPv4-mapped IPv6 form. The last matters to tierlb beyond syntax: the data path folds `::ffff:a.b.c.d`
/// to IPv4, so an IPv6 VIP or backend written that way could never match nor be reached.
pub(super) fn strict_ip(value: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = value.parse().map_err(|_| format!("{value:?} is not an IP address"))?;
    if let IpAddr::V6(v6) = ip
        && let Some(v4) = v6.to_ipv4_mapped()
    {
        return Err(format!(
            "{value} is an IPv4-mapped IPv6 address, which the API server rejects (and tierlb's data path \
             would fold to IPv4, so it never matches): write it as {v4}"
        ));
    }
    Ok(ip)
}

/// `ValidateEndpointIP` (`ValidateNonSpecialIP` in newer releases), which the API server applies to
/// EndpointSlice addresses and external IPs: not unspecified, loopback, link-local or link-local multicast.
/// A backend there would send a rewritten connect to the client's own node or to the metadata service.
/// `fix` says what to write instead.
pub(super) fn non_special_ip(ip: IpAddr, fix: &str) -> Result<(), String> {
    let what = match ip {
        _ if ip.is_unspecified() => "unspecified (0.0.0.0, ::)",
        _ if ip.is_loopback() => "in the loopback range (127.0.0.0/8, ::1/128)",
        IpAddr::V4(v4) if v4.is_link_local() => "in the link-local range (169.254.0.0/16, fe80::/10)",
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => {
            "in the link-local range (169.254.0.0/16, fe80::/10)"
        }
        // Go's IsLinkLocalMulticast: 224.0.0.0/24, and IPv6 multicast of link-local scope (ffX2::/16).
        IpAddr::V4(v4) if v4.octets()[..3] == [224, 0, 0] => {
            "in the link-local multicast range (224.0.0.0/24, ff02::/16)"
        }
        IpAddr::V6(v6) if v6.segments()[0] & 0xff0f == 0xff02 => {
            "in the link-local multicast range (224.0.0.0/24, ff02::/16)"
        }
        _ => return Ok(()),
    };
    Err(format!("{ip} may not be {what}: {fix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_api_servers_rules() {
        assert!(dns1123_label("dns-tcp").is_ok());
        assert!(dns1123_label("9p").is_ok());
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert!(dns1035_label("web").is_ok());
        assert!(dns1035_label("9web").is_err());
        assert!(dns1123_subdomain("node-1.zone.example").is_ok());
        for bad in ["", ".a", "a..b", "a.", "Node1", &"a.".repeat(127)] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
        for good in ["", "zone-a", "Zone_A.1"] {
            assert!(label_value(good).is_ok(), "{good:?}");
        }
        for bad in ["-a", "a b", "a/", &"a".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn special_and_mapped_addresses_are_refused() {
        for bad in ["127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.1", "::1", "::", "fe80::1", "ff02::1"]
        {
            assert!(non_special_ip(bad.parse().unwrap(), "").is_err(), "{bad}");
        }
        for good in ["10.244.1.5", "239.1.1.1", "fd00::5", "ff05::1"] {
            assert!(non_special_ip(good.parse().unwrap(), "").is_ok(), "{good}");
        }
        assert!(strict_ip("::ffff:10.0.0.1").unwrap_err().contains("write it as 10.0.0.1"));
        assert!(strict_ip("010.0.0.1").is_err());
        assert!(strict_ip("fd00::1").is_ok());
    }
}
