//! Manifest bytes -> objects: never a panic, and every object the source accepts is valid by the API
//! server's rules (`tierlb_fuzz::check_object`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (objects, diagnostics) = tierlb::source::manifests::parse_text("fuzz.yaml".as_ref(), &text);
    for o in &objects {
        if let Err(why) = tierlb_fuzz::check_object(o) {
            panic!("accepted an invalid object ({why}): {o:?}\ndiagnostics: {diagnostics:?}");
        }
    }
    for d in &diagnostics {
        // Every problem is located in this file and says something.
        assert!(!d.message.is_empty(), "{d:?}");
        let _ = d.to_string();
    }
});
