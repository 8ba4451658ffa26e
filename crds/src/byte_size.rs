//! Buffer sizes as a spec writes them (`spec.allReduceBenchmark.sizes`): a number of bytes, or of KiB or MiB with
//! the suffix `Ki` or `Mi` (`4096`, `4Ki`, `64Mi`), as Kubernetes quantities spell binary units. The CRD's CEL rule
//! accepts exactly what [`parse`] accepts (`validation` repeats its message).

/// The smallest buffer: one f32.
pub const MIN_BYTES: u64 = 4;
/// The largest buffer a rank allocates for the benchmark (256 MiB).
pub const MAX_BYTES: u64 = 256 << 20;

/// What the CRD and `validate_spec` say about a size they refuse (Rust adds the entry it got).
pub const SIZE_MESSAGE: &str = "spec.allReduceBenchmark.sizes entries must be a number of bytes, or of KiB or MiB \
    with the suffix Ki or Mi (4096, 4Ki, 64Mi): a multiple of 4 bytes (one f32) from 4 to 256Mi";

/// The CEL rule of one entry `s`, the same acceptance as [`parse`]: plain bytes up to 9 digits checked as numbers,
/// and the bounds of the `Ki` and `Mi` forms (1Ki to 262144Ki, 1Mi to 256Mi) as patterns.
pub const SIZE_RULE: &str = "self.all(s, (s.matches('^[1-9][0-9]{0,8}$') && int(s) >= 4 && int(s) <= 268435456 \
    && int(s) % 4 == 0) || s.matches('^([1-9][0-9]{0,4}|1[0-9]{5}|2[0-5][0-9]{4}|26[01][0-9]{3}|2620[0-9]{2}|\
    2621[0-3][0-9]|26214[0-4])Ki$') || s.matches('^([1-9][0-9]?|1[0-9]{2}|2[0-4][0-9]|25[0-6])Mi$'))";

/// The bytes `text` stands for, or why it is refused.
pub fn parse(text: &str) -> Result<u64, String> {
    let refuse = || format!("{SIZE_MESSAGE} (got {text:?})");
    let (digits, unit) = if let Some(n) = text.strip_suffix("Ki") {
        (n, 1u64 << 10)
    } else if let Some(n) = text.strip_suffix("Mi") {
        (n, 1u64 << 20)
    } else {
        (text, 1)
    };
    // Digits only, no sign, no leading zero (the CEL pattern's form).
    if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse());
    }
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(unit))
        .ok_or_else(refuse)?;
    if !(MIN_BYTES..=MAX_BYTES).contains(&bytes) || bytes % 4 != 0 {
        return Err(refuse());
    }
    Ok(bytes)
}

/// `bytes` as the spec would write it: `Mi` or `Ki` when it is a whole number of them.
pub fn format(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}Mi", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}Ki", b >> 10),
        b => b.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_bytes_with_binary_suffixes() {
        for (text, bytes) in [
            ("4", 4),
            ("4096", 4096),
            ("4Ki", 4096),
            ("1Ki", 1024),
            ("64Mi", 64 << 20),
            ("256Mi", 256 << 20),
            ("262144Ki", 256 << 20),
            ("268435456", 256 << 20),
            ("12", 12),
        ] {
            assert_eq!(parse(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_crds_message() {
        for text in [
            "",
            "0",
            "2",
            "6",
            "04",
            "-4",
            "+4",
            " 4",
            "4 ",
            "4KiB",
            "4K",
            "4ki",
            "1Gi",
            "Ki",
            "0Ki",
            "257Mi",
            "262145Ki",
            "268435460",
            "1.5Mi",
            "1e3",
            "99999999999999999999Mi",
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.starts_with(SIZE_MESSAGE), "{text}: {error}");
            assert!(error.ends_with(&format!("(got {text:?})")), "{error}");
        }
    }

    #[test]
    fn a_size_formats_as_a_spec_writes_it_and_reads_back() {
        for bytes in [4, 1000, 4096, 65536, 1 << 20, 64 << 20, 3 << 10] {
            assert_eq!(parse(&format(bytes)), Ok(bytes), "{bytes}");
        }
        assert_eq!(format(64 << 20), "64Mi");
        assert_eq!(format(4096), "4Ki");
        assert_eq!(format(1000), "1000");
    }
}
