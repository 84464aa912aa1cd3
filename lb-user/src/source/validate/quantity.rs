//! Resource quantities (apimachinery `resource.ParseQuantity`): `<sign><digits>[.<digits>]<suffix>` with a
//! decimal SI suffix (n u m "" k M G T P E), a binary one (Ki Mi Gi Ti Pi Ei) or an exponent (e3, E-2).
//!
//! The API server accepts quantities far larger than any node has (`18446744073709551615m` is a valid
//! allocatable CPU), so the value saturates at `u64::MAX` millicores instead of overflowing, and every sum
//! of them is taken in u128 (`hints`).

/// CPU as millicores, rounded up as `Quantity.MilliValue()` does; negative quantities are refused
/// (`ValidateNonnegativeQuantity`).
pub(crate) fn cpu_millis(q: &str) -> Result<u64, String> {
    let bad = || format!("{q:?} is not a quantity: write cores (\"4\", \"1.5\") or millicores (\"3500m\")");
    let (negative, rest) = match q.as_bytes().first() {
        Some(b'-') => (true, &q[1..]),
        Some(b'+') => (false, &q[1..]),
        _ => (false, q),
    };
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    let (e10, b2): (i64, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            // Beyond any u128 either way: the clamp changes nothing but keeps the sum below from overflowing.
            (
                exp.parse::<i64>()
                    .unwrap_or(if exp.starts_with('-') { -1000 } else { 1000 })
                    .clamp(-1000, 1000),
                0,
            )
        }
        _ => return Err(bad()),
    };
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    // value = mantissa * 10^exp * 2^b2, in millicores.
    let mut exp = e10 + 3 - i64::try_from(frac.len()).unwrap_or(i64::MAX / 2);
    let kept = digits.len().min(38);
    let mantissa: u128 = if kept == 0 { 0 } else { digits[..kept].parse().map_err(|_| bad())? };
    // Digits past what u128 holds scale the value; a non-zero one among them rounds it up.
    exp += i64::try_from(digits.len() - kept).unwrap_or(i64::MAX / 2);
    let sticky = digits[kept..].bytes().any(|b| b != b'0');
    if mantissa == 0 {
        return Ok(0);
    }
    if negative {
        return Err(format!("{q} is negative: allocatable CPU cannot be"));
    }
    let scaled = mantissa.checked_mul(1u128 << b2);
    let millis = match (scaled, u32::try_from(exp.unsigned_abs())) {
        (Some(v), Ok(e)) if exp >= 0 => 10u128.checked_pow(e).and_then(|p| v.checked_mul(p)),
        (Some(v), Ok(e)) => Some(match 10u128.checked_pow(e) {
            // Rounded up, as MilliValue() does.
            Some(p) => v / p + u128::from(v % p != 0 || sticky),
            None => 1,
        }),
        // Overflow, or an exponent beyond u32: saturate.
        (None, _) | (Some(_), Err(_)) => None,
    };
    Ok(millis.map_or(u64::MAX, |m| u64::try_from(m).unwrap_or(u64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::cpu_millis;

    #[test]
    fn quantities_as_the_api_server_reads_them() {
        let cases: &[(&str, Option<u64>)] = &[
            ("4", Some(4000)),
            ("1.5", Some(1500)),
            ("3500m", Some(3500)),
            ("+2", Some(2000)),
            (".5", Some(500)),
            ("5.", Some(5000)),
            ("1k", Some(1_000_000)),
            ("1Ki", Some(1_024_000)),
            ("2e3", Some(2_000_000)),
            ("15E-1", Some(1500)),
            ("1u", Some(1)),
            ("1500n", Some(1)),
            ("0.0001", Some(1)),
            ("-0", Some(0)),
            ("18446744073709551615m", Some(u64::MAX)),
            ("18446744073709551616m", Some(u64::MAX)),
            ("1Ei", Some(u64::MAX)),
            ("9e999999999999", Some(u64::MAX)),
            (&"9".repeat(200), Some(u64::MAX)),
            ("lots", None),
            ("", None),
            (".", None),
            ("1.2.3", None),
            ("1e", None),
            ("1x", None),
            ("-1", None),
        ];
        for (q, want) in cases {
            assert_eq!(cpu_millis(q).ok(), *want, "{q:?}");
        }
    }
}
