//! The lexer: a file's text to words, punctuation and `::`, with line numbers. Comments, string literals
//! and char literals are blanked first, so a path in them does not count.

/// The text with comments, string literals and char literals blanked out (newlines kept, for line numbers).
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for c in s {
            out.push(if *c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, 0);
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if !prev_ident
            && (rest.starts_with(b"r#") || rest.starts_with(b"r\"") || rest.starts_with(b"br"))
        {
            let start = if rest[0] == b'b' { 2 } else { 1 };
            let hashes = rest[start..].iter().take_while(|c| **c == b'#').count();
            if rest.get(start + hashes) != Some(&b'"') {
                out.push(rest[0] as char);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = start + hashes + 1;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close)
                .map_or(rest.len(), |p| body + p + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A char literal ('x', '\n', '\u{1F600}', '"'), else a lifetime or label ('a).
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|c| *c == b'\'').map_or(1, |p| p + 3)
            } else {
                let ch = src[i + 1..].chars().next().map_or(0, char::len_utf8);
                if rest.get(1 + ch) == Some(&b'\'') { 2 + ch } else { 1 }
            };
            if end == 1 {
                out.push('\'');
            } else {
                blank(&mut out, &rest[..end]);
            }
            i += end;
        } else {
            let ch = src[i..].chars().next().expect("in bounds");
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    Ident(String),
    Punct(char),
    PathSep,
}

pub(crate) type Toks = [(Tok, usize)];

/// The tokens of `src` (comments and literals left out), each with its line.
pub(crate) fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let src = &strip(src);
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = src.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let mut s = String::from(c);
            while let Some((_, n)) = chars.peek().copied().filter(|(_, n)| n.is_alphanumeric() || *n == '_') {
                s.push(n);
                chars.next();
            }
            out.push((Tok::Ident(s), line));
        } else if c == ':' && chars.peek().is_some_and(|(_, n)| *n == ':') {
            chars.next();
            out.push((Tok::PathSep, line));
        } else if !c.is_whitespace() {
            out.push((Tok::Punct(c), line));
        }
    }
    out
}
