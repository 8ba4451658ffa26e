//! Reading the workers' tracing lines as the tests need them.

/// `key=value` from a tracing line (the last one, the value up to the next space, `}` or `,`, quotes removed).
pub fn field_of(text: &str, key: &str) -> Option<String> {
    let needle = format!("{key}=");
    text.match_indices(&needle)
        .filter(|(i, _)| {
            *i == 0
                || !text.as_bytes()[i - 1].is_ascii_alphanumeric() && text.as_bytes()[i - 1] != b'_'
        })
        .last()
        .map(|(i, _)| {
            text[i + needle.len()..]
                .split(|c: char| c.is_whitespace() || c == '}' || c == ',')
                .next()
                .unwrap_or_default()
                .trim_matches('"')
                .to_string()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_tracing_lines() {
        let line = "2026-11-23T21:00:00Z  INFO worker{rank=3 job=digits generation=0}: rdu_worker::train: training starts total_steps=660 tile_affinity=0x8 samples_per_rank=359";
        assert_eq!(field_of(line, "rank").as_deref(), Some("3"));
        assert_eq!(field_of(line, "total_steps").as_deref(), Some("660"));
        assert_eq!(field_of(line, "tile_affinity").as_deref(), Some("0x8"));
        assert_eq!(field_of(line, "steps"), None);
    }
}
