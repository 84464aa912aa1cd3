//! A strict parser of the OpenMetrics text format (what `/metrics` serves): every sample belongs to a family
//! declared by `# TYPE` before it, with the suffixes its type allows; label sets are well formed; values are
//! numbers; histogram buckets are cumulative, end at `+Inf` and agree with `_count`; `# EOF` ends the text.
//! Anything else fails the test with the line. (prometheus-parse, the crates.io parser, reads only the
//! Prometheus 0.0.4 format, where a counter's samples carry the family's own name.)
use std::collections::BTreeMap;

/// One sample: its name as written (with its suffix), labels, value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Sample {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
}

/// One metric family.
#[derive(Clone, Debug, Default)]
pub(crate) struct MetricFamily {
    pub(crate) kind: String,
    pub(crate) help: String,
    pub(crate) samples: Vec<Sample>,
}

impl MetricFamily {
    /// The samples named `name` whose labels include `labels`.
    pub(crate) fn values(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .collect()
    }

    /// The one sample `name` with exactly these labels (apart from `le`); panics unless there is exactly one.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let v = self.values(name, labels);
        assert_eq!(v.len(), 1, "{name}{labels:?}: {:?}", self.samples);
        v[0]
    }
}

fn suffixes(kind: &str) -> &'static [&'static str] {
    match kind {
        "counter" => &["_total", "_created"],
        "gauge" | "unknown" | "info" | "stateset" => &[""],
        "histogram" => &["_bucket", "_count", "_sum", "_created"],
        "summary" => &["", "_count", "_sum", "_created"],
        other => panic!("unknown metric type {other:?}"),
    }
}

fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn number(s: &str) -> f64 {
    match s {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        _ => s.parse().unwrap_or_else(|_| panic!("not a number: {s:?}")),
    }
}

/// `name{a="x",b="y"} value`: the name, the labels, the rest.
fn sample_line(line: &str) -> (String, BTreeMap<String, String>, &str) {
    let name_end = line.find(['{', ' ']).unwrap_or_else(|| panic!("no value: {line:?}"));
    let name = &line[..name_end];
    assert!(valid_name(name), "bad metric name in {line:?}");
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            if c == '}' {
                end = Some(i);
                break;
            }
            let key_start = i;
            let mut key_end = i;
            for (j, c) in chars.by_ref() {
                if c == '=' {
                    key_end = j;
                    break;
                }
            }
            let key = &body[key_start..key_end];
            assert!(valid_name(key), "bad label name {key:?} in {line:?}");
            assert_eq!(chars.next().map(|x| x.1), Some('"'), "unquoted label value in {line:?}");
            let mut value = String::new();
            loop {
                match chars.next().map(|x| x.1) {
                    Some('"') => break,
                    Some('\\') => match chars.next().map(|x| x.1) {
                        Some('n') => value.push('\n'),
                        Some(c @ ('\\' | '"')) => value.push(c),
                        other => panic!("bad escape {other:?} in {line:?}"),
                    },
                    Some(c) => value.push(c),
                    None => panic!("unterminated label value in {line:?}"),
                }
            }
            assert!(labels.insert(key.to_owned(), value).is_none(), "label {key} twice in {line:?}");
            match chars.peek().map(|x| x.1) {
                Some(',') => {
                    chars.next();
                }
                Some('}') => {}
                other => panic!("expected , or }} after a label, got {other:?} in {line:?}"),
            }
        }
        let end = end.unwrap_or_else(|| panic!("unterminated labels in {line:?}"));
        rest = &body[end + 1..];
    }
    let rest = rest.strip_prefix(' ').unwrap_or_else(|| panic!("no space before the value in {line:?}"));
    (name.to_owned(), labels, rest)
}

/// Parse `text`; panics at the first violation.
pub(crate) fn parse(text: &str) -> BTreeMap<String, MetricFamily> {
    let mut families: BTreeMap<String, MetricFamily> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut ended = false;
    for line in text.lines() {
        assert!(!ended, "text after # EOF: {line:?}");
        if line == "# EOF" {
            ended = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let (keyword, rest) = rest.split_once(' ').unwrap_or_else(|| panic!("bad comment {line:?}"));
            let (name, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(valid_name(name), "bad family name in {line:?}");
            match keyword {
                "TYPE" => {
                    suffixes(arg);
                    let f = families.entry(name.to_owned()).or_default();
                    assert!(f.kind.is_empty() && f.samples.is_empty(), "family {name} declared twice");
                    arg.clone_into(&mut f.kind);
                    current = Some(name.to_owned());
                }
                "HELP" => {
                    arg.clone_into(&mut families.entry(name.to_owned()).or_default().help);
                }
                "UNIT" => {}
                other => panic!("unknown descriptor {other:?} in {line:?}"),
            }
            continue;
        }
        let (name, labels, value) = sample_line(line);
        let family = current.as_ref().unwrap_or_else(|| panic!("sample before any # TYPE: {line:?}"));
        let f = families.get_mut(family).unwrap();
        let suffix = name.strip_prefix(family.as_str()).unwrap_or_else(|| {
            panic!("sample {name} outside its family {family} (samples of a family are written together)")
        });
        assert!(
            suffixes(&f.kind).contains(&suffix),
            "{name}: suffix {suffix:?} not allowed for a {}",
            f.kind
        );
        let value = value.split(' ').next().unwrap();
        f.samples.push(Sample { name, labels, value: number(value) });
    }
    assert!(ended, "no # EOF at the end");
    for (name, f) in &families {
        assert!(!f.kind.is_empty(), "{name}: HELP without TYPE");
        if f.kind == "histogram" {
            check_histogram(name, f);
        }
    }
    families
}

/// Labels apart from `le`, in name order.
type LabelSet = Vec<(String, String)>;

/// Per label set: buckets with `le`, cumulative, the last `+Inf`, equal to `_count`.
fn check_histogram(name: &str, f: &MetricFamily) {
    let mut series: BTreeMap<LabelSet, Vec<(f64, f64)>> = BTreeMap::new();
    for s in f.samples.iter().filter(|s| s.name.ends_with("_bucket")) {
        let le = number(s.labels.get("le").unwrap_or_else(|| panic!("{name}: a bucket without le")));
        let key: Vec<(String, String)> =
            s.labels.iter().filter(|(k, _)| *k != "le").map(|(k, v)| (k.clone(), v.clone())).collect();
        series.entry(key).or_default().push((le, s.value));
    }
    for (labels, buckets) in series {
        let count = f
            .samples
            .iter()
            .find(|s| {
                s.name == format!("{name}_count")
                    && s.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<Vec<_>>() == labels
            })
            .unwrap_or_else(|| panic!("{name}{labels:?}: no _count"));
        for w in buckets.windows(2) {
            assert!(
                w[0].0 < w[1].0 && w[0].1 <= w[1].1,
                "{name}{labels:?}: buckets not cumulative: {buckets:?}"
            );
        }
        let last = buckets.last().unwrap();
        // Both are counts, integers written as floats: exact comparison is right.
        assert!(
            last.0.is_infinite() && last.1.to_bits() == count.value.to_bits(),
            "{name}{labels:?}: +Inf bucket != _count"
        );
    }
}
