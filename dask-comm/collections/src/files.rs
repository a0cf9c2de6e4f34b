//! File patterns for the bag and the dataframe: the files a glob names (read side), and the
//! file names of an output pattern (write side).

use std::path::PathBuf;

/// Why a pattern gave no files.
#[derive(Debug)]
pub(crate) enum PatternError {
    /// The pattern is malformed (or an output pattern has not exactly one `*`).
    Malformed(String),
    /// A path the pattern reaches could not be listed.
    Io { path: PathBuf, reason: String },
    /// The pattern matches no file.
    NoFiles,
}

/// The files `pattern` names, sorted (a path without wildcards names itself).
pub(crate) fn expand(pattern: &str) -> Result<Vec<PathBuf>, PatternError> {
    let paths = glob::glob(pattern).map_err(|e| PatternError::Malformed(e.to_string()))?;
    let mut out = Vec::new();
    for p in paths {
        let p = p.map_err(|e| PatternError::Io {
            path: e.path().to_path_buf(),
            reason: e.error().to_string(),
        })?;
        if p.is_file() {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(PatternError::NoFiles);
    }
    out.sort();
    Ok(out)
}

/// The file names of `n` partitions written to `pattern`: its one `*` replaced by the
/// partition's number, zero-padded so that the names sort in partition order.
pub(crate) fn names(pattern: &str, n: usize) -> Result<Vec<String>, PatternError> {
    if pattern.matches('*').count() != 1 {
        return Err(PatternError::Malformed(
            "an output pattern needs exactly one `*` (replaced by the partition number)".into(),
        ));
    }
    let width = n.saturating_sub(1).to_string().len();
    Ok((0..n)
        .map(|i| pattern.replacen('*', &format!("{i:0width$}"), 1))
        .collect())
}
