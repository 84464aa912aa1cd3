//! Random sequences of applies against the in-memory maps: after every step the maps hold what a fresh
//! reconciler applying the same desired state writes (frontends, tiers, flags; ids and generations aside),
//! failed frontends keep their previous contents, and once the grace period is over no slot and no service
//! id is left behind.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tierlb_fuzz::sequence::{Steps, run};

fuzz_target!(|steps: Steps| run(&steps));
