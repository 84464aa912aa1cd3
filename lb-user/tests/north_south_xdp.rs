//! The north-south suite (`tests/north_south`) again, unchanged, every agent of this release run with
//! `--xdp=native` on node-1's veth uplink (the lab keys it on this binary's name: `lab::xdp_from_env`) and the
//! LAN made a wire for it (`lab::wire_for_xdp`): what tc passed, XDP with tc behind it passes too.
#[path = "north_south/main.rs"]
mod suite;
