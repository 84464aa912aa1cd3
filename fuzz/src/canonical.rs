//! The canonical form of a YAML stream: each document read as tierlb reads it (`tierlb::source::yaml`, as a
//! JSON value: mapping keys are strings) and written back by the serializer (plain scalars quoted where they
//! would read as another type, one key order, no anchors, aliases or comments). `None` where the text is not
//! a stream of documents the reader takes whole, or holds `&`, `*` or `!` anywhere (anchors, aliases and
//! tags, whose expansion the reader limits; checked on the text, so some plain strings holding those
//! characters are left out too).

/// The canonical YAML of `text`, documents joined with `---`.
pub fn canonical(text: &str) -> Option<String> {
    if text.contains('&') || text.contains('*') || text.contains('!') {
        return None;
    }
    let mut out = Vec::new();
    let mut whole = true;
    tierlb::source::yaml::each_document(text, |_, doc| match doc.ok().and_then(|v| serde_saphyr::to_string(&v).ok()) {
        Some(yaml) => {
            out.push(yaml);
            true
        }
        None => {
            whole = false;
            false
        }
    });
    whole.then(|| out.join("---\n"))
}
