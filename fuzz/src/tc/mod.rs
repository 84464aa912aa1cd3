//! The tc target's lab, packets and oracle: arbitrary packets, in sequences of up to four through the same
//! conntrack state, run through `tc_ingress` and `tc_egress` with `BPF_PROG_TEST_RUN`.
pub mod answer;
pub mod lab;
pub mod oracle;
pub mod packet;

use std::cell::RefCell;

thread_local! {
    static LAB: RefCell<Option<lab::Lab>> = const { RefCell::new(None) };
}

/// Run one input: the lab's state emptied, then each step judged (`oracle::judge`).
pub fn run(input: &packet::Input) {
    LAB.with(|cell| {
        let mut cell = cell.borrow_mut();
        let lab = cell.get_or_insert_with(lab::Lab::new);
        lab.reset();
        let mut prev: packet::Previous = None;
        for step in input.steps.iter().take(4) {
            let frame = step.bytes(prev);
            let before = lab.tracked();
            let Some((rc, out)) = lab.run(step.egress, &frame) else { continue };
            let after = lab.tracked();
            oracle::judge(step.egress, &frame, rc, &out, before, after);
            prev = oracle::frame_view(&out).and_then(|v| {
                let p = out.get(v.l4..v.l4 + 4)?;
                Some((u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])))
            });
        }
    });
}
