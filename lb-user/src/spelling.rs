//! "Did you mean": the closest of a set of names to one a user typed (a field, a node), by edit distance.

/// Levenshtein distance (names are short).
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The name of `known` closest to `typed` and other than it, if one is close enough to be a typo of it: at
/// most 2 edits, and fewer for short names (a quarter of the name's length, plus one).
pub(crate) fn closest<'a>(typed: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .filter(|k| *k != typed)
        .map(|k| (edit_distance(k, typed), k))
        .filter(|(d, k)| *d <= 2.min(k.len() / 4 + 1))
        .min()
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_typo_finds_the_name_and_a_stranger_finds_none() {
        let cases: &[(&str, &[&str], Option<&str>)] = &[
            ("node-9", &["node-1", "node-2", "node-3"], Some("node-1")),
            ("nod-2", &["node-1", "node-2"], Some("node-2")),
            ("sessionAfinity", &["sessionAffinity", "selector"], Some("sessionAffinity")),
            ("worker-a", &["node-1", "node-2"], None),
            ("node-1", &["node-1"], None),
            ("ab", &["xy"], None),
        ];
        for (typed, known, want) in cases {
            assert_eq!(super::closest(typed, known.iter().copied()), *want, "{typed} among {known:?}");
        }
        assert_eq!(super::edit_distance("kitten", "sitting"), 3);
    }
}
