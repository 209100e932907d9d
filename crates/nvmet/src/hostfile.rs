//! The per-host key files of the target (`--nvme-dhchap-secret`, `--nvme-tls-psk`): one host
//! per line, `HOSTNQN KEY [KEY]`, fields separated by spaces or tabs, `#` comments and blank
//! lines skipped. One place splits the lines and checks the host NQNs and reads the file with
//! its permission bits; each file's own module parses its keys.

/// One line of a host key file.
pub(crate) struct HostLine<'a> {
    /// Its number, from 1 (for errors).
    pub n: usize,
    pub hostnqn: &'a str,
    /// The fields after the host NQN.
    pub keys: Vec<&'a str>,
}

/// The host lines of `text`, each with `keys` key fields; `shape` describes a line for errors
/// (`HOSTNQN DHHC-1:..: [CONTROLLER-SECRET]`). A host named twice is an error. Errors name the
/// line and never quote a key.
pub(crate) fn host_lines<'a>(
    text: &'a str,
    keys: std::ops::RangeInclusive<usize>,
    shape: &str,
) -> Result<Vec<HostLine<'a>>, String> {
    let mut out: Vec<HostLine<'a>> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !keys.contains(&(fields.len() - 1)) {
            return Err(format!(
                "line {n}: expected `{shape}`, found {} field(s)",
                fields.len()
            ));
        }
        let hostnqn = fields[0];
        if hostnqn.len() > 223 || !hostnqn.starts_with("nqn.") {
            return Err(format!(
                "line {n}: {hostnqn:?} is not a host NQN (nqn.*, at most 223 bytes)"
            ));
        }
        if out.iter().any(|l| l.hostnqn == hostnqn) {
            return Err(format!("line {n}: host {hostnqn} appears twice"));
        }
        out.push(HostLine {
            n,
            hostnqn,
            keys: fields[1..].to_vec(),
        });
    }
    Ok(out)
}

/// Reads a key file: its text and its permission bits (0o777 mask; 0 when unknown).
pub(crate) fn read(path: &std::path::Path) -> Result<(String, u32), String> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read it: {e}", path.display()))?;
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o777)
        .unwrap_or(0);
    Ok((text, mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_fields_hosts_and_duplicates() {
        let text = "# c\n\n nqn.a  K1\tK2 \nnqn.b K3\n";
        let l = host_lines(text, 1..=2, "HOSTNQN KEY [KEY]").unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(
            (l[0].n, l[0].hostnqn, l[0].keys.clone()),
            (3, "nqn.a", vec!["K1", "K2"])
        );
        assert_eq!(
            (l[1].n, l[1].hostnqn, l[1].keys.clone()),
            (4, "nqn.b", vec!["K3"])
        );
        let e = host_lines("nqn.a\n", 1..=2, "S").err().unwrap();
        assert_eq!(e, "line 1: expected `S`, found 1 field(s)");
        let e = host_lines("x.a K\n", 1..=1, "S").err().unwrap();
        assert!(e.starts_with("line 1: \"x.a\" is not a host NQN"), "{e}");
        let e = host_lines("nqn.a K\nnqn.a L\n", 1..=1, "S").err().unwrap();
        assert_eq!(e, "line 2: host nqn.a appears twice");
    }
}
