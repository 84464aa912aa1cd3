//! Incremental Internet checksum updates (RFC 1624, eqn. 3: `HC' = ~(~HC + ~m + m')`) for the fields the tc
//! programs rewrite where the kernel's helpers do not fit: inside an ICMP error's quoted packet, whose
//! checksums are plain data of the ICMP message (`bpf_l4_csum_replace` on them would also adjust a
//! `CHECKSUM_COMPLETE` skb's sum for a change the ICMP checksum already cancels).
//!
//! Values are taken as they lie in the packet, loaded in the machine's order: the one's complement sum is
//! independent of byte order (RFC 1071, 2.B), so a checksum loaded and stored the same way stays right.

/// A running sum of changes (`~old + new` per 16-bit word), to be applied with `apply`.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CsumDiff(pub u32);

impl CsumDiff {
    /// Account for a 16-bit word changed from `from` to `to`.
    #[inline(always)]
    #[must_use]
    pub fn word(self, from: u16, to: u16) -> Self {
        Self(self.0 + u32::from(!from) + u32::from(to))
    }

    /// Account for a 32-bit field (two words) changed from `from` to `to`.
    #[inline(always)]
    #[must_use]
    #[expect(clippy::cast_possible_truncation, reason = "the halves of a u32")]
    pub fn long(self, from: u32, to: u32) -> Self {
        self.word(from as u16, to as u16).word((from >> 16) as u16, (to >> 16) as u16)
    }

    /// Account for another sum of changes.
    #[inline(always)]
    #[must_use]
    pub fn and(self, other: Self) -> Self {
        Self(self.0 + other.0)
    }

    /// The checksum `csum` after the changes summed here.
    #[inline(always)]
    #[must_use]
    pub fn apply(self, csum: u16) -> u16 {
        !fold(u32::from(!csum) + self.0)
    }
}

/// Fold a 32-bit one's complement sum to 16 bits.
#[inline(always)]
#[must_use]
#[expect(clippy::cast_possible_truncation, reason = "folded to 16 bits first")]
pub fn fold(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 from scratch, over big-endian words.
    fn full(data: &[u8]) -> u16 {
        let mut s = 0u32;
        for c in data.chunks(2) {
            s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
        !fold(s)
    }

    fn be(data: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([data[at], data[at + 1]])
    }

    #[test]
    fn csum_incremental_updates_match_a_full_recomputation_in_either_byte_order() {
        // A 20-byte IPv4 header with its checksum at 10, and edits of a word, a long and both.
        let mut hdr = [
            0x45u8, 0, 0, 0x3c, 0x1c, 0x46, 0x40, 0, 0x40, 0x06, 0, 0, 0xac, 0x10, 0x0a, 0x63, 0xac, 0x10,
            0x0a, 0x0c,
        ];
        let c = full(&hdr);
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(full(&hdr), 0, "a header with its checksum sums to zero");
        let cases: [(usize, &[u8]); 4] =
            [(12, &[10, 244, 1, 2]), (16, &[0xff, 0xff, 0xff, 0xff]), (4, &[0, 0]), (16, &[0, 0, 0, 0])];
        for (at, new) in cases {
            for native in [false, true] {
                let mut h = hdr;
                let old = h;
                h[at..at + new.len()].copy_from_slice(new);
                // Words as the program loads them: big-endian, or the machine's (little-endian) order.
                let load =
                    |d: &[u8], i: usize| if native { u16::from_le_bytes([d[i], d[i + 1]]) } else { be(d, i) };
                let mut diff = CsumDiff::default();
                for i in (at..at + new.len()).step_by(2) {
                    diff = diff.word(load(&old, i), load(&h, i));
                }
                let updated = diff.apply(load(&old, 10));
                let bytes = if native { updated.to_le_bytes() } else { updated.to_be_bytes() };
                h[10..12].copy_from_slice(&bytes);
                assert_eq!(full(&h), 0, "{at} <- {new:?}, machine order {native}");
            }
        }
    }

    #[test]
    fn csum_long_equals_two_words_and_changes_cancel() {
        let d = CsumDiff::default().long(0x0a00_0001, 0xc000_0201);
        let w = CsumDiff::default().word(0x0001, 0x0201).word(0x0a00, 0xc000);
        assert_eq!(d.apply(0x1234), w.apply(0x1234));
        let back = d.and(CsumDiff::default().long(0xc000_0201, 0x0a00_0001));
        assert_eq!(back.apply(0x1234), 0x1234, "a change and its undoing leave the checksum");
        assert_eq!(CsumDiff::default().apply(0xbeef), 0xbeef);
    }
}
