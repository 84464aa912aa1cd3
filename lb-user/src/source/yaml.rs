//! YAML as tierlb reads it: serde-saphyr (the parser kube-rs reads kubeconfigs with: pure Rust, no unsafe
//! code, maintained), held to what tierlb read before with serde_yaml 0.9 (YAML 1.2's core schema): only
//! `true`/`false` are booleans (`yes`, `on` stay strings), `0755` and `1_000` are strings, a merge key `<<` is
//! an ordinary key (an unknown field), a duplicate key and a tag it does not know are errors. Its budget limits
//! nesting to 64 levels, keeps the alias limits and lifts the size limits (a manifest directory of 100,000 Services
//! is read), and its errors stay on one line (no source snippet).
use serde::de::DeserializeOwned;
use serde_saphyr::{Budget, DuplicateKeyPolicy, MergeKeyPolicy, Options};

/// The parser's options (see the module's documentation).
#[must_use]
pub fn options() -> Options {
    let mut budget = Budget::default();
    budget.max_reader_input_bytes = None;
    budget.max_events = usize::MAX;
    budget.max_documents = usize::MAX;
    budget.max_nodes = usize::MAX;
    budget.max_total_scalar_bytes = usize::MAX;
    // 64 levels (serde-saphyr's own default; a Kubernetes object nests about 15): at serde_yaml's 128, a
    // 200-deep flow sequence overflowed a test thread's 2 MiB stack in a debug build before the limit.
    budget.max_depth = 64;
    budget.flow_nesting_limit = 64;
    let mut options = Options::default();
    options.budget = Some(budget);
    options.duplicate_keys = DuplicateKeyPolicy::Error;
    options.merge_keys = MergeKeyPolicy::AsOrdinary;
    options.strict_booleans = true;
    options.leading_zero_numbers_as_strings = true;
    options.underscored_numbers_as_strings = true;
    options.reject_unsupported_tags = true;
    options.with_snippet = false;
    options
}

/// Each document of `text` in turn (empty ones skipped), as a JSON value (mapping keys are strings, as
/// kubectl's reader makes them), with its index among them; `f` returns whether to go on. A syntax error is
/// the last item.
pub fn each_document(
    text: &str,
    mut f: impl FnMut(usize, Result<serde_json::Value, serde_saphyr::Error>) -> bool,
) {
    let mut reader = text.as_bytes();
    for (index, doc) in serde_saphyr::read_with_options(&mut reader, options()).enumerate() {
        if !f(index, doc) {
            break;
        }
    }
}

/// The 1-based line where each non-empty document of `text` starts (its first line that is neither blank nor
/// a comment), in `each_document`'s order, so a message can name `file:LINE`. Documents are split at
/// lines starting `---` or `...`, as a YAML stream is.
pub fn document_lines(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut current: Option<usize> = None;
    let content = |s: &str| {
        let t = s.trim();
        !t.is_empty() && !t.starts_with('#')
    };
    for (i, line) in text.lines().enumerate() {
        let marker = ["---", "..."].iter().find(|m| {
            line.strip_prefix(**m).is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
        });
        if let Some(m) = marker {
            starts.extend(current.take());
            // `--- {a: 1}` starts its document on the marker's line.
            if *m == "---" && content(&line[3..]) {
                current = Some(i + 1);
            }
            continue;
        }
        if current.is_none() && content(line) {
            current = Some(i + 1);
        }
    }
    starts.extend(current);
    starts
}

/// One document of `text` as a `T`; an error gives the path of the field (`.` for the document) and what
/// is wrong there.
pub fn typed<T: DeserializeOwned>(text: &str) -> Result<T, (String, String)> {
    // A field that does not read ends the document early; the reader then reports the events left over as
    // another document, so the field's own error is taken first.
    let mut field = None;
    let read = serde_saphyr::with_deserializer_from_str_with_options(text, options(), |de| {
        Ok(serde_path_to_error::deserialize::<_, T>(de)
            .map_err(|e| field = Some((e.path().to_string(), e.inner().to_string())))
            .ok())
    });
    if let Some(e) = field {
        return Err(e);
    }
    match read {
        Ok(Some(t)) => Ok(t),
        Ok(None) => Err((".".to_owned(), "not read".to_owned())),
        Err(e) => Err((".".to_owned(), e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    fn docs(text: &str) -> Vec<Result<serde_json::Value, String>> {
        let mut out = Vec::new();
        super::each_document(text, |_, d| {
            out.push(d.map_err(|e| e.to_string()));
            true
        });
        out
    }

    #[test]
    fn document_lines_match_each_document_and_skip_empty_ones() {
        let cases = [
            ("a: 1\n---\n---\nb: 2\n", vec![1, 4]),
            ("---\na: 1\n---\n# c\n---\nb: 2\n---\n", vec![2, 6]),
            ("# x\n\na: 1\n...\n---\nb: 2", vec![3, 6]),
            ("--- {a: 1}\n--- # only a comment\n  b: 2\n", vec![1, 3]),
            ("a: |\n  --- not a marker\n", vec![1]),
        ];
        for (text, want) in cases {
            assert_eq!(super::document_lines(text), want, "{text:?}");
            assert_eq!(docs(text).len(), want.len(), "as many as each_document gives: {text:?}");
        }
    }

    #[test]
    fn scalars_read_as_yaml_1_2_core_and_errors_stay_errors() {
        let one = |t: &str| docs(t).remove(0);
        assert_eq!(
            one("a: yes\nb: on\nc: true\nd: 0755\ne: 1_000\nf: 80\ng: 10.96.0.020\nh: ~"),
            Ok(json!({
                "a": "yes", "b": "on", "c": true, "d": "0755", "e": "1_000", "f": 80, "g": "10.96.0.020", "h": null
            }))
        );
        assert_eq!(one("<<: {a: 1}\nb: 2"), Ok(json!({"<<": {"a": 1}, "b": 2})), "a merge key is a key");
        assert_eq!(one("80: x"), Ok(json!({"80": "x"})), "keys are strings");
        assert!(one("a: 1\na: 2").is_err(), "a duplicate key");
        assert!(one("a: !mytag 1").is_err(), "an unknown tag");
        let nested = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(one(&nested).is_err(), "nesting past the limit");
        let within = format!("{}1{}", "[".repeat(60), "]".repeat(60));
        assert!(one(&within).is_ok(), "nesting within the limit");
        let err = one("a: [1, 2\nb: 3").unwrap_err();
        assert!(!err.contains('\n'), "one line: {err}");
    }

    #[test]
    fn documents_are_taken_in_turn_up_to_a_syntax_error() {
        let all = docs("a: 1\n---\n---\nb: 2\n---\nc: [\n---\nd: 4\n");
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(all[0], Ok(json!({"a": 1})));
        assert_eq!(all[1], Ok(json!({"b": 2})), "the empty document is skipped");
        assert!(all[2].is_err());
    }

    #[test]
    fn a_typed_document_names_the_field() {
        #[derive(Debug, serde::Deserialize)]
        struct S {
            #[expect(dead_code, reason = "read to be checked")]
            spec: Spec,
        }
        #[derive(Debug, serde::Deserialize)]
        struct Spec {
            #[expect(dead_code, reason = "read to be checked")]
            port: u16,
        }
        let (path, message) = super::typed::<S>("spec:\n  port: eighty\n").unwrap_err();
        assert_eq!(path, "spec.port");
        assert!(message.contains("eighty") || message.contains("invalid"), "{message}");
        assert!(super::typed::<S>("spec:\n  port: 80\n").is_ok());
    }
}
