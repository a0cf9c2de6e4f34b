//! Text files in and out: `read_text` (one partition per file, or per block of bytes split at
//! line boundaries; `.gz` read transparently, one partition per file) and `to_textfiles`.

use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use crate::files::PatternError;

use super::steps::Sink;
use super::{BagError, Item, Part};

fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// The files `pattern` names, sorted.
pub(crate) fn expand(pattern: &str) -> Result<Vec<PathBuf>, BagError> {
    crate::files::expand(pattern).map_err(|e| pattern_error(pattern, e))
}

fn pattern_error(pattern: &str, e: PatternError) -> BagError {
    let pattern = pattern.to_string();
    match e {
        PatternError::Malformed(reason) => BagError::Pattern { pattern, reason },
        PatternError::Io { path, reason } => BagError::Io { path, reason },
        PatternError::NoFiles => BagError::NoFiles { pattern },
    }
}

/// The byte ranges of `path`'s partitions: the whole file, or blocks of `blocksize` bytes for
/// an uncompressed file (`u64::MAX` for "to the end").
pub(crate) fn blocks(path: &Path, blocksize: Option<u64>) -> Result<Vec<(u64, u64)>, BagError> {
    let Some(bs) = blocksize.filter(|_| !is_gz(path)) else {
        return Ok(vec![(0, u64::MAX)]);
    };
    let len = std::fs::metadata(path)
        .map_err(|e| BagError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?
        .len();
    let bs = bs.max(1);
    let n = len.div_ceil(bs).max(1);
    Ok((0..n)
        .map(|i| (i * bs, if i + 1 == n { u64::MAX } else { (i + 1) * bs }))
        .collect())
}

fn io_err(path: &str, e: io::Error) -> String {
    format!("{path}: {e}")
}

/// The lines of `path` that start in `[start, end)`, without their line ends (`\n` or `\r\n`).
pub(crate) fn read_lines(path: &str, start: u64, end: u64) -> Result<Part, String> {
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let (mut r, mut pos): (Box<dyn BufRead>, u64) = if is_gz(Path::new(path)) {
        let gz = MultiGzDecoder::new(BufReader::new(file));
        (Box::new(BufReader::with_capacity(1 << 16, gz)), 0)
    } else {
        let mut f = BufReader::with_capacity(1 << 16, file);
        let mut pos = 0;
        if start > 0 {
            // A line that starts in the previous block belongs to it: skip to the first line
            // that starts at or after `start`.
            f.seek(SeekFrom::Start(start - 1))
                .map_err(|e| io_err(path, e))?;
            // Skipped without keeping it: a line may be as long as the file.
            let n = f.skip_until(b'\n').map_err(|e| io_err(path, e))?;
            pos = start - 1 + n as u64;
        }
        (Box::new(f), pos)
    };
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    while end == u64::MAX || pos < end {
        buf.clear();
        let n = r.read_until(b'\n', &mut buf).map_err(|e| io_err(path, e))?;
        if n == 0 {
            break;
        }
        pos += n as u64;
        if buf.last() == Some(&b'\n') {
            buf.pop();
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
        }
        let line = std::str::from_utf8(&buf)
            .map_err(|_| format!("{path}: the line at byte {} is not UTF-8", pos - n as u64))?;
        lines.push(Item::str(line));
    }
    Ok(Part(lines))
}

/// Writes `items` to `path`, one line each (strings as they are, anything else as JSON);
/// gzip-compressed when the name ends in `.gz`. Returns the lines written.
pub(crate) fn write_lines(
    path: &str,
    run: &mut dyn FnMut(Sink<'_>) -> Result<(), String>,
) -> Result<u64, String> {
    let p = Path::new(path);
    if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io_err(path, e))?;
    }
    let file = File::create(p).map_err(|e| io_err(path, e))?;
    let mut w: Box<dyn Write> = if is_gz(p) {
        Box::new(GzEncoder::new(
            BufWriter::new(file),
            flate2::Compression::default(),
        ))
    } else {
        Box::new(BufWriter::new(file))
    };
    let mut n = 0u64;
    run(&mut |x| {
        match &x {
            Item::Str(s) => w.write_all(s.as_bytes()),
            other => w.write_all(other.to_json().as_bytes()),
        }
        .and_then(|_| w.write_all(b"\n"))
        .map_err(|e| io_err(path, e))?;
        n += 1;
        Ok(())
    })?;
    w.flush().map_err(|e| io_err(path, e))?;
    drop(w);
    Ok(n)
}

/// The file names of `to_textfiles(pattern)` for `n` partitions.
pub(crate) fn names(pattern: &str, n: usize) -> Result<Vec<String>, BagError> {
    crate::files::names(pattern, n).map_err(|e| pattern_error(pattern, e))
}
