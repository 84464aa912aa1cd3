//! Arbitrary packets through the north-south tc programs (`BPF_PROG_TEST_RUN`, the product's own BPF object)
//! in sequences sharing conntrack state: no verdict outside tc's, no length change, nothing but addresses,
//! TTLs, ports and checksums changed, valid checksums kept valid (IPv4 options, extension headers, ICMP
//! quotes), nothing rewritten that is not about a frontend (`tierlb_fuzz::tc::oracle`). Needs root.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierlb_fuzz::tc::{packet::Input, run};

fuzz_target!(|input: Input| run(&input));
