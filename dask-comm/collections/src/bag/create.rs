//! Bags from items, integer ranges and text files.

use dask_graph::{Arg, Graph, Key, Task};

use super::{
    Bag, BagError, Item, JSON_LOADS, NOT_BLANK, Part, fresh_name, kernels, register, text,
};

/// A bag of `items` in `npartitions` partitions of nearly equal length (Dask's
/// `from_sequence`; fewer partitions when there are fewer items).
///
/// ```
/// use dask_collections::bag::{self, Item};
/// let b = bag::from_sequence((0..10).map(Item::Int), 3)?;
/// assert_eq!(b.npartitions(), 3);
/// assert_eq!(b.count().compute(&dask_graph::Inline)?, Item::Int(10));
/// # Ok::<(), bag::BagError>(())
/// ```
pub fn from_sequence(
    items: impl IntoIterator<Item = Item>,
    npartitions: usize,
) -> Result<Bag, BagError> {
    register();
    if npartitions == 0 {
        return Err(BagError::NoPartitions {
            what: "from_sequence",
        });
    }
    let items: Vec<Item> = items.into_iter().collect();
    let n = npartitions.min(items.len()).max(1);
    let name = fresh_name("from-sequence");
    let mut g = Graph::new();
    let mut it = items.into_iter();
    let total = it.len();
    for i in 0..n {
        let len = total / n + usize::from(i < total % n);
        let part: Vec<Item> = it.by_ref().take(len).collect();
        g.insert(
            Key::new(&name, &[i as u32]),
            dask_graph::Value::new(Part(part)),
        );
    }
    Ok(Bag::new(name, n, &[], g))
}

/// The integers `0..n` in `npartitions` partitions (Dask's `bag.range`).
///
/// ```
/// use dask_collections::bag::{self, Item};
/// let b = bag::range(100, 7)?;
/// assert_eq!(b.sum().compute(&dask_graph::Inline)?, Item::Int(4950));
/// # Ok::<(), bag::BagError>(())
/// ```
pub fn range(n: u64, npartitions: usize) -> Result<Bag, BagError> {
    register();
    if npartitions == 0 {
        return Err(BagError::NoPartitions { what: "range" });
    }
    let n = i64::try_from(n).unwrap_or(i64::MAX);
    let parts = npartitions.min(n.max(1) as usize);
    let name = fresh_name("range");
    let mut g = Graph::new();
    let step = n.div_euclid(parts as i64);
    let extra = n.rem_euclid(parts as i64);
    let mut start = 0i64;
    for i in 0..parts {
        let len = step + i64::from((i as i64) < extra);
        g.insert(
            Key::new(&name, &[i as u32]),
            Task::new(kernels::RANGE, [Arg::lit(start), Arg::lit(start + len)]),
        );
        start += len;
    }
    Ok(Bag::new(name, parts, &[], g))
}

/// The lines of the text files `pattern` names (a glob, sorted), without their line ends: one
/// partition per file, or, with `blocksize`, one per block of that many bytes of each
/// uncompressed file (a line belongs to the block it starts in). Files ending in `.gz` are
/// decompressed as they are read (one partition each). Lines must be UTF-8.
///
/// ```
/// use dask_collections::bag::{self, Item};
/// let dir = std::env::temp_dir().join(format!("bag-doc-read-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("a.txt"), "one\ntwo\n").unwrap();
/// std::fs::write(dir.join("b.txt"), "three\n").unwrap();
/// let b = bag::read_text(&format!("{}/*.txt", dir.display()), None)?;
/// assert_eq!(b.npartitions(), 2);
/// assert_eq!(b.compute(&dask_graph::Inline)?, ["one", "two", "three"].map(Item::from));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// # Ok::<(), bag::BagError>(())
/// ```
pub fn read_text(pattern: &str, blocksize: Option<u64>) -> Result<Bag, BagError> {
    register();
    let name = fresh_name("read-text");
    let mut g = Graph::new();
    let mut i = 0u32;
    for path in text::expand(pattern)? {
        for (start, end) in text::blocks(&path, blocksize)? {
            let p = path.to_string_lossy().into_owned();
            g.insert(
                Key::new(&name, &[i]),
                Task::new(kernels::READ, [Arg::lit(p), Arg::lit(start), Arg::lit(end)]),
            );
            i += 1;
        }
    }
    Ok(Bag::new(name, i as usize, &[], g))
}

/// JSON lines: [`read_text`] with every line parsed ([`JSON_LOADS`]); blank lines (nothing
/// but whitespace) skipped.
pub fn read_json(pattern: &str, blocksize: Option<u64>) -> Result<Bag, BagError> {
    read_text(pattern, blocksize)?
        .filter(NOT_BLANK)?
        .map(JSON_LOADS)
}
