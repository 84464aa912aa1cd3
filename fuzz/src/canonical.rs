//! The canonical form of a YAML stream: each document read as a YAML value and written back by the
//! serializer (plain scalars quoted where they would read as another type, one key order, no anchors,
//! aliases or comments). `None` where the text is not a stream of documents the serializer can write back
//! as they were read: a syntax error, a mapping key that is not a string, or a text holding `&`, `*` or `!`
//! anywhere (anchors, aliases and tags, whose expansion the reader limits; checked on the text, so some
//! plain strings holding those characters are left out too).
use serde::Deserialize as _;

/// The canonical YAML of `text`, documents joined with `---`.
pub fn canonical(text: &str) -> Option<String> {
    if text.contains('&') || text.contains('*') || text.contains('!') {
        return None;
    }
    let mut out = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(doc).ok()?;
        if !string_keys(&value) {
            return None;
        }
        out.push(serde_yaml::to_string(&value).ok()?);
    }
    Some(out.join("---\n"))
}

fn string_keys(v: &serde_yaml::Value) -> bool {
    match v {
        serde_yaml::Value::Mapping(m) => m.iter().all(|(k, v)| k.is_string() && string_keys(v)),
        serde_yaml::Value::Sequence(s) => s.iter().all(string_keys),
        serde_yaml::Value::Tagged(_) => false,
        _ => true,
    }
}
