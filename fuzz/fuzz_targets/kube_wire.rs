//! The kube wire path's hand-written readers (lb-user/src/source/kube/lean.rs, which skip managedFields and
//! the annotations nothing reads) against k8s-openapi's own types, over arbitrary JSON: whatever the full type
//! reads, the lean one reads too and converts to the same object or refusal, naming the same pods. The first
//! byte picks the kind (even: Service, odd: EndpointSlice), the rest is the document.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((kind, json)) = data.split_first() else { return };
    if let Err(e) = tierlb::source::kube::lean_reads_as_full(kind % 2 == 0, json) {
        panic!("{e}");
    }
});
