//! The Internet checksum (RFC 1071), written here independently of the product's incremental updates
//! (`lb_common::CsumDiff`): what the packet tests build their packets with and check rewritten ones against,
//! and what `router` signs its ICMP errors with.

/// RFC 1071 one's-complement sum of `data` added to `acc`, folded to 16 bits (not yet inverted).
pub fn sum16(data: &[u8], mut acc: u32) -> u32 {
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
        acc += u32::from(w);
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

/// The checksum field's value for `data` with the partial sum `acc` (a pseudo-header's) added.
pub fn checksum(data: &[u8], acc: u32) -> u16 {
    !(sum16(data, acc) as u16)
}
