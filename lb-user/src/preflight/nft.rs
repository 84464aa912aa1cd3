//! The nftables chains of this network namespace, read over netlink (`NFT_MSG_GETCHAIN` dumped), as
//! `nft list chains` reads them: the image has no nft binary, and iptables-nft (Debian's iptables since 10)
//! keeps its rules there too, so kube-proxy's chains are found whichever of its modes wrote them.
use std::io;

/// A chain: its table's family (`NFPROTO_*`), its table and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Chain {
    pub(super) family: u8,
    pub(super) table: String,
    pub(super) name: String,
}

impl Chain {
    /// The family as nft names it (`ip`, `ip6`, `inet`, ...).
    pub(super) fn family_name(&self) -> &'static str {
        match self.family {
            1 => "inet",
            2 => "ip",
            3 => "arp",
            5 => "netdev",
            7 => "bridge",
            10 => "ip6",
            _ => "unknown",
        }
    }
}

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;

/// Every chain of every nftables table in this network namespace.
pub(super) fn chains() -> io::Result<Vec<Chain>> {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
    let fd =
        unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&sock);
    // nlmsghdr (16 bytes) and nfgenmsg (family NFPROTO_UNSPEC, version 0, res_id 0).
    let mut req = Vec::with_capacity(20);
    req.extend_from_slice(&20u32.to_ne_bytes());
    req.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETCHAIN).to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[0, 0, 0, 0]);
    // SAFETY: `req` is a valid buffer of its length; the kernel's address is the zeroed sockaddr_nl.
    let sent = unsafe { libc::send(raw, req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = usize::try_from(n).unwrap_or(0);
        if n == 0 {
            return Ok(out);
        }
        if parse(&buf[..n], &mut out)? {
            return Ok(out);
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Parse one datagram of the dump into `out`: `true` when it held the dump's end.
fn parse(buf: &[u8], out: &mut Vec<Chain>) -> io::Result<bool> {
    let mut at = 0;
    while at + 16 <= buf.len() {
        let len = u32_at(buf, at) as usize;
        let kind = u16_at(buf, at + 4);
        if len < 16 || at + len > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a netlink message overruns its datagram",
            ));
        }
        let msg = &buf[at..at + len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = i32::from_ne_bytes([msg[16], msg[17], msg[18], msg[19]]);
                if errno != 0 {
                    return Err(io::Error::from_raw_os_error(-errno));
                }
            }
            // A dump answers with a NEWCHAIN message per chain.
            k if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN && len >= 20 => {
                let family = msg[16];
                let (mut table, mut name) = (String::new(), String::new());
                let mut a = 20;
                while a + 4 <= msg.len() {
                    let alen = u16_at(msg, a) as usize;
                    let atype = u16_at(msg, a + 2) & 0x3fff;
                    if alen < 4 || a + alen > msg.len() {
                        break;
                    }
                    let value = &msg[a + 4..a + alen];
                    let text = || {
                        String::from_utf8_lossy(value.split(|b| *b == 0).next().unwrap_or(value)).into_owned()
                    };
                    match atype {
                        NFTA_CHAIN_TABLE => table = text(),
                        NFTA_CHAIN_NAME => name = text(),
                        _ => {}
                    }
                    a += (alen + 3) & !3;
                }
                out.push(Chain { family, table, name });
            }
            _ => {}
        }
        at += (len + 3) & !3;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message as the kernel sends it: header, nfgenmsg, the table and name attributes.
    fn message(family: u8, table: &str, name: &str) -> Vec<u8> {
        let attr = |kind: u16, s: &str| {
            let mut v = Vec::new();
            let len = 4 + s.len() + 1;
            v.extend_from_slice(&u16::try_from(len).unwrap().to_ne_bytes());
            v.extend_from_slice(&kind.to_ne_bytes());
            v.extend_from_slice(s.as_bytes());
            v.push(0);
            v.resize((v.len() + 3) & !3, 0);
            v
        };
        let mut body = vec![family, 0, 0, 0];
        body.extend(attr(NFTA_CHAIN_TABLE, table));
        body.extend(attr(NFTA_CHAIN_NAME, name));
        let mut m = Vec::new();
        m.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_ne_bytes());
        m.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN).to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend(body);
        m
    }

    #[test]
    fn a_dump_is_read_chain_by_chain_to_its_end() {
        let mut buf = message(2, "nat", "KUBE-SERVICES");
        buf.extend(message(10, "kube-proxy", "services"));
        let mut done = vec![0u8; 20];
        done[..4].copy_from_slice(&20u32.to_ne_bytes());
        done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        let mut out = Vec::new();
        assert!(!parse(&buf, &mut out).unwrap(), "no end yet");
        assert!(parse(&done, &mut out).unwrap());
        let got: Vec<(&str, &str, &str)> =
            out.iter().map(|c| (c.family_name(), c.table.as_str(), c.name.as_str())).collect();
        assert_eq!(got, [("ip", "nat", "KUBE-SERVICES"), ("ip6", "kube-proxy", "services")]);
        let mut short = message(2, "nat", "x");
        short.truncate(18);
        short[..4].copy_from_slice(&40u32.to_ne_bytes());
        assert!(parse(&short, &mut Vec::new()).is_err(), "an overrun is an error, not a chain");
    }
}
