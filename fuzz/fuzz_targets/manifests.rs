//! Manifest bytes -> objects: never a panic; every object the source accepts is valid by the API server's
//! rules (`tierlb_fuzz::check_object`); and the objects depend on what the documents say, not on how they are
//! written: the same documents re-serialised in canonical YAML (`tierlb_fuzz::canonical`) give the same
//! objects.
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
    if let Some(canonical) = tierlb_fuzz::canonical(&text) {
        let (again, again_diagnostics) =
            tierlb::source::manifests::parse_text("fuzz.yaml".as_ref(), &canonical);
        assert_eq!(
            objects, again,
            "the canonical form of the documents gives other objects\n{canonical}\ndiagnostics: {diagnostics:?}\nthen: {again_diagnostics:?}"
        );
    }
});
