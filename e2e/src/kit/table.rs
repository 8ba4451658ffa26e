//! Cells of the tables `kubectl get` prints: each column's cells start where its header does, and an empty cell
//! is blank, so a row cannot be split on whitespace.

/// The cell of column `column` (its header, as kubectl prints it) in the row whose first cell is `row`.
pub fn cell(table: &str, row: &str, column: &str) -> Option<String> {
    let mut lines = table.lines();
    let header = lines.next()?;
    let at = header.match_indices(column).map(|(i, _)| i).find(|&i| {
        let before = header[..i].chars().next_back();
        let after = header[i + column.len()..].chars().next();
        before.is_none_or(char::is_whitespace) && after.is_none_or(char::is_whitespace)
    })?;
    let line = lines.find(|l| l.split_whitespace().next() == Some(row))?;
    line.get(at..)?
        .split_whitespace()
        .next()
        .filter(|_| !line[at..].starts_with(' '))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::cell;

    const TABLE: &str = "\
NAME      PHASE       READY   RESTARTS   QUEUE      PROGRESS%   ETA(S)   AGE
low       Running     4/4     0          Admitted                        1s
watched   Pending     0/2     0                     25          12       0s
";

    #[test]
    fn a_cell_is_found_under_its_header_and_a_blank_one_is_none() {
        assert_eq!(cell(TABLE, "low", "QUEUE").as_deref(), Some("Admitted"));
        assert_eq!(cell(TABLE, "low", "PROGRESS%"), None);
        assert_eq!(cell(TABLE, "watched", "QUEUE"), None);
        assert_eq!(cell(TABLE, "watched", "PROGRESS%").as_deref(), Some("25"));
        assert_eq!(cell(TABLE, "watched", "ETA(S)").as_deref(), Some("12"));
        assert_eq!(cell(TABLE, "watched", "READY").as_deref(), Some("0/2"));
        assert_eq!(cell(TABLE, "nobody", "READY"), None);
        assert_eq!(cell(TABLE, "low", "QUEUED"), None);
    }
}
