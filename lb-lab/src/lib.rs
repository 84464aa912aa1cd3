//! tierlb's lab, apart from the product: the incident demo (`cargo xtask demo`) and the benchmark (`cargo
//! xtask bench`), both driven by the `tierlb-lab` binary, which is also the client the in-kernel tests run
//! inside a simulated node.
#![warn(missing_docs)]
pub mod bench;
pub mod demo;
#[cfg(test)]
mod render;
