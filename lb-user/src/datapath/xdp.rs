//! `xdp_ingress` on the NodePort devices, beside `tc_ingress` (which it hands everything it does not finish):
//! an accelerator only. Without it tc translates every packet, so attaching, replacing or removing it never
//! interrupts traffic, only changes where it is translated.
//!
//! `--xdp`: `auto` (the default) attaches it in the driver (native XDP) where the driver has XDP, except on
//! a veth, whose `XDP_TX` and `XDP_REDIRECT` need an XDP program on its peer (the peer is another
//! namespace's, which this node cannot see: `native` asserts it); `generic` runs it in the stack's receive
//! path (any device; skbs already exist, so it saves little); `off` leaves every packet to tc.
//!
//! The link is pinned per device and mode (`link_xdp_native@DEVICE`, `link_xdp_generic@DEVICE`) and stays
//! when the agent stops, as the tc links do: the next agent replaces the program of a pinned link of the same
//! mode in place (`BPF_LINK_UPDATE`). Not detached and attached again at each restart: many drivers
//! reconfigure their rings when a device goes from no XDP program to one and back (i40e, ixgbe, mlx5), a
//! moment without traffic on the whole device, which a swap of one program for another does not cost. A
//! link of the other mode is removed first; `--xdp=off` removes the links, as `--cleanup` does.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU8, Ordering},
};

use aya::{
    Ebpf,
    programs::{
        Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};

use super::error::{DatapathError, bpf_err};

/// The program's name in the object.
pub const XDP_PROGRAM: &str = "xdp_ingress";

/// `--xdp`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpSetting {
    /// Native XDP where the device's driver has it, except on a veth; else none.
    #[default]
    Auto,
    /// Native XDP (in the driver); a device whose driver has none is left to tc, logged.
    Native,
    /// Generic XDP (in the stack's receive path, on any device).
    Generic,
    /// No XDP: tc translates every packet.
    Off,
}

static SETTING: AtomicU8 = AtomicU8::new(0);

impl XdpSetting {
    /// Set the process's setting (the agent, at start).
    pub fn set(self) {
        SETTING.store(self as u8, Ordering::Relaxed);
    }

    /// The process's setting.
    pub fn current() -> Self {
        match SETTING.load(Ordering::Relaxed) {
            1 => Self::Native,
            2 => Self::Generic,
            3 => Self::Off,
            _ => Self::Auto,
        }
    }
}

/// How `xdp_ingress` is attached to a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpAttached {
    /// In the driver.
    Native,
    /// In the stack's receive path.
    Generic,
}

impl XdpAttached {
    const ALL: [Self; 2] = [Self::Native, Self::Generic];

    /// Its name in pins, status and metrics.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }

    const fn mode(self) -> XdpMode {
        match self {
            Self::Native => XdpMode::Driver,
            Self::Generic => XdpMode::Skb,
        }
    }
}

/// Where the XDP link on `device` in `mode` is pinned.
#[must_use]
pub fn link_pin(dir: &Path, mode: XdpAttached, device: &str) -> PathBuf {
    dir.join(format!("link_xdp_{}@{device}", mode.name()))
}

/// The XDP link pins of `device` in `dir` that exist.
#[must_use]
pub fn pins(dir: &Path, device: &str) -> Vec<PathBuf> {
    XdpAttached::ALL.iter().map(|m| link_pin(dir, *m, device)).filter(|p| p.exists()).collect()
}

/// The devices `xdp_ingress` is on, by the instance's pins in `dir`, and how.
#[must_use]
pub fn pinned(dir: &Path) -> BTreeMap<String, XdpAttached> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        for mode in XdpAttached::ALL {
            if let Some(device) = name.strip_prefix(&format!("link_xdp_{}@", mode.name())) {
                out.insert(device.to_owned(), mode);
            }
        }
    }
    out
}

/// The driver of `device` (`ETHTOOL_GDRVINFO`), if it says.
#[must_use]
pub fn driver(device: &str) -> Option<String> {
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    // struct ethtool_drvinfo: cmd, driver[32], version[32], fw_version[32], bus_info[32], erom_version[32],
    // reserved2[12], five u32 counts: 196 bytes.
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 160],
    }
    let (sock, mut req) = super::sys::device_request(device)?;
    let mut info = DrvInfo { cmd: ETHTOOL_GDRVINFO, driver: [0; 32], rest: [0; 160] };
    req.ifr_ifru.ifru_data = (&raw mut info).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO writes a struct ethtool_drvinfo where ifr_data points, which
    // `info` is, alive for the call.
    let rc = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&sock), SIOCETHTOOL, &raw mut req) };
    if rc != 0 {
        return None;
    }
    let end = info.driver.iter().position(|b| *b == 0).unwrap_or(info.driver.len());
    Some(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

/// The mode `setting` asks for on `device`: `None` for none.
fn wanted(setting: XdpSetting, device: &str) -> Option<XdpAttached> {
    match setting {
        XdpSetting::Off => None,
        XdpSetting::Native => Some(XdpAttached::Native),
        XdpSetting::Generic => Some(XdpAttached::Generic),
        XdpSetting::Auto => (driver(device).as_deref() != Some("veth")).then_some(XdpAttached::Native),
    }
}

/// Attach `xdp_ingress` to `device` as the process's setting says (after `tc_ingress`, which takes what it
/// passes): `Ok(None)` where it asks for none (and a link of ours there is removed), or where `auto` found no
/// native XDP in the driver. With `pin_dir` the link is pinned there: a pinned link of the same mode gets the
/// new program in place, one of the other mode is removed first.
pub fn attach(
    ebpf: &mut Ebpf,
    device: &str,
    pin_dir: Option<&Path>,
) -> Result<Option<XdpAttached>, DatapathError> {
    let setting = XdpSetting::current();
    let Some(mode) = wanted(setting, device) else {
        if let Some(dir) = pin_dir {
            detach(dir, device);
        }
        return Ok(None);
    };
    let p: &mut Xdp = ebpf
        .program_mut(XDP_PROGRAM)
        .ok_or_else(|| DatapathError::Bpf {
            what: format!("program {XDP_PROGRAM} missing"),
            source: "absent".into(),
        })?
        .try_into()
        .map_err(|e| bpf_err(format!("program {XDP_PROGRAM}"), e))?;
    if p.fd().is_err() {
        p.load().map_err(|e| bpf_err(format!("verifying program {XDP_PROGRAM}"), e))?;
    }
    if let Some(dir) = pin_dir {
        for other in XdpAttached::ALL.into_iter().filter(|m| *m != mode) {
            super::sys::detach_link_pin(&link_pin(dir, other, device));
        }
        let path = link_pin(dir, mode, device);
        if let Ok(pinned) = PinnedLink::from_pin(&path) {
            let updated = XdpLink::try_from(FdLink::from(pinned))
                .map_err(|e| e.to_string())
                .and_then(|link| p.attach_to_link(link).map_err(|e| e.to_string()));
            match updated {
                Ok(id) => {
                    // The pin holds the link; the program's copy of it goes without detaching it.
                    std::mem::forget(p.take_link(id));
                    return Ok(Some(mode));
                }
                Err(e) => {
                    tracing::warn!(device, error = %e, "cannot replace the program of the pinned XDP link; attaching anew");
                    super::sys::detach_link_pin(&path);
                }
            }
        }
    }
    let attaching = |e| {
        bpf_err(
            format!(
                "attaching {XDP_PROGRAM} to device {device} in {} mode (needs CAP_NET_ADMIN)",
                mode.name()
            ),
            e,
        )
    };
    let id = match p.attach(device, mode.mode()) {
        Ok(id) => id,
        Err(e) if setting == XdpSetting::Auto => {
            tracing::info!(device, error = %e, "no native XDP on this device: tc translates its traffic");
            return Ok(None);
        }
        Err(e) => return Err(attaching(e)),
    };
    let Some(dir) = pin_dir else { return Ok(Some(mode)) };
    let link = p.take_link(id).map_err(|e| bpf_err(format!("taking the link of {XDP_PROGRAM}"), e))?;
    let link = FdLink::try_from(link)
        .map_err(|e| bpf_err(format!("link of {XDP_PROGRAM} (netlink, not a BPF link)"), e))?;
    let path = link_pin(dir, mode, device);
    link.pin(&path).map_err(|e| bpf_err(format!("pinning {}", path.display()), e))?;
    Ok(Some(mode))
}

/// Remove `device`'s XDP link pins in `dir` (which detaches `xdp_ingress` there); the pins removed.
pub fn detach(dir: &Path, device: &str) -> Vec<PathBuf> {
    let found = pins(dir, device);
    for p in &found {
        super::sys::detach_link_pin(p);
    }
    found
}

/// Remove every XDP link pin in `dir` (`--cleanup`); the pins removed.
pub fn detach_all(dir: &Path) -> Vec<PathBuf> {
    pinned(dir).keys().flat_map(|d| detach(dir, d)).collect()
}
