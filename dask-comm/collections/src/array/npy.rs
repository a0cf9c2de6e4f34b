//! NumPy's `.npy` format for chunks, and stacks of `.npy` files for arrays (Dask's
//! `to_npy_stack` / `from_npy_stack`): one file per block along an axis, written and read by
//! tasks, so workers write and read their own blocks (they must share the directory).
//!
//! The stack's description is `info.json` (the axis, the blocks' lengths along it, the shape
//! and NumPy's type string) — Dask keeps a pickle there; each block file is an ordinary
//! `.npy` NumPy opens with `np.load`.

use std::path::{Path, PathBuf};

use dask_graph::{Arg, Graph, Scheduler, Task};
use serde::{Deserialize, Serialize};

use super::create::key;
use super::{Array, ArrayError, Chunk, DType, Elem, each, fresh_name};

/// Why a `.npy` file or stack could not be read or written.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The file system refused.
    #[error("{path}: {kind}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        kind: std::io::ErrorKind,
    },
    /// Not a `.npy` file (no magic string, or a version this reader does not know).
    #[error("not a .npy file (or an unknown version)")]
    Magic,
    /// A header this reader cannot understand.
    #[error("a .npy header it cannot read: {0}")]
    Header(&'static str),
    /// An element type the array has no counterpart for.
    #[error("element type {descr:?} is not one of bool, uint8, int32, int64, float32, float64")]
    DType {
        /// NumPy's type string.
        descr: String,
    },
    /// Data of another length than the header's shape says.
    #[error("{got} bytes of data where the shape says {expected}")]
    Length {
        /// What the shape says.
        expected: u64,
        /// What the file holds.
        got: u64,
    },
    /// A stack description that does not describe an array.
    #[error("a stack's info.json that does not describe an array")]
    Info,
}

impl NpyError {
    fn io(path: &Path, e: &std::io::Error) -> NpyError {
        NpyError::Io {
            path: path.to_path_buf(),
            kind: e.kind(),
        }
    }
}

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(t: DType) -> &'static str {
    match t {
        DType::Bool => "|b1",
        DType::U8 => "|u1",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::F32 => "<f4",
        DType::F64 => "<f8",
    }
}

fn dtype_of(descr: &str) -> Option<DType> {
    Some(match descr {
        "|b1" | "<b1" | "b1" | "?" => DType::Bool,
        "|u1" | "<u1" | "u1" => DType::U8,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        _ => return None,
    })
}

/// A chunk as the bytes of a `.npy` file (version 1.0, C order, little-endian).
pub fn to_npy_bytes(c: &Chunk) -> Vec<u8> {
    let shape = match c.shape() {
        [n] => format!("({n},)"),
        s => format!(
            "({})",
            s.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(c.dtype())
    );
    // Magic, version, length, header and newline: a multiple of 64 bytes.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(
        MAGIC.len() + 4 + header.len() + c.shape().iter().product::<usize>() * c.dtype().size(),
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    each!(c, a => a.iter().for_each(|v| v.put(&mut out)));
    out
}

/// The value of `key` in a Python dict literal: the text after `'key':` up to the next
/// top-level comma or closing brace.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    let mut depth = 0i32;
    for (i, ch) in rest.char_indices() {
        match ch {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(rest[..i].trim()),
            _ => {}
        }
    }
    None
}

/// A chunk from the bytes of a `.npy` file (versions 1–3; C or Fortran order; the six element
/// types, little-endian). The data's length is checked against the shape before anything is
/// built from it.
pub fn from_npy_bytes(bytes: &[u8]) -> Result<Chunk, NpyError> {
    let rest = bytes.strip_prefix(MAGIC).ok_or(NpyError::Magic)?;
    let (len, start) = match rest {
        [1, 0, a, b, ..] => (u16::from_le_bytes([*a, *b]) as usize, MAGIC.len() + 4),
        [2 | 3, 0, a, b, c, d, ..] => (
            u32::from_le_bytes([*a, *b, *c, *d]) as usize,
            MAGIC.len() + 6,
        ),
        _ => return Err(NpyError::Magic),
    };
    let header = bytes
        .get(start..start.saturating_add(len))
        .ok_or(NpyError::Header("shorter than its length"))?;
    let header = std::str::from_utf8(header).map_err(|_| NpyError::Header("not text"))?;
    let descr = field(header, "descr")
        .ok_or(NpyError::Header("no descr"))?
        .trim_matches(|c| c == '\'' || c == '"');
    let dtype = dtype_of(descr).ok_or_else(|| NpyError::DType {
        descr: descr.to_string(),
    })?;
    let fortran = match field(header, "fortran_order") {
        Some("False") => false,
        Some("True") => true,
        _ => return Err(NpyError::Header("no fortran_order")),
    };
    let shape_text = field(header, "shape").ok_or(NpyError::Header("no shape"))?;
    let shape = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or(NpyError::Header("a shape that is not a tuple"))?
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| NpyError::Header("a length that is not a number"))
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let data = &bytes[start + len..];
    let expected = shape
        .iter()
        .try_fold(dtype.size() as u64, |acc, &n| acc.checked_mul(n as u64))
        .ok_or(NpyError::Header("a shape too large to hold"))?;
    if expected != data.len() as u64 {
        return Err(NpyError::Length {
            expected,
            got: data.len() as u64,
        });
    }
    // Fortran order is C order of the reversed shape, transposed.
    let stored: Vec<usize> = if fortran {
        shape.iter().rev().copied().collect()
    } else {
        shape.clone()
    };
    fn read<T: Elem + super::ChunkElem>(data: &[u8], shape: &[usize]) -> Chunk {
        let v: Vec<T> = data.chunks_exact(T::DTYPE.size()).map(T::get).collect();
        T::wrap(ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(shape), v).expect("length checked"))
    }
    let c = match dtype {
        DType::Bool => read::<bool>(data, &stored),
        DType::U8 => read::<u8>(data, &stored),
        DType::I32 => read::<i32>(data, &stored),
        DType::I64 => read::<i64>(data, &stored),
        DType::F32 => read::<f32>(data, &stored),
        DType::F64 => read::<f64>(data, &stored),
    };
    Ok(if fortran {
        each!(&c, a => Chunk::from(a.clone().reversed_axes().as_standard_layout().into_owned()))
    } else {
        c
    })
}

/// A stack's description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Info {
    axis: usize,
    chunks: Vec<usize>,
    shape: Vec<usize>,
    dtype: String,
}

/// Writes one block (the task of [`Array::to_npy_stack`]); its value is the bytes written.
pub(crate) fn write_block(path: &str, c: &Chunk) -> Result<u64, String> {
    let bytes = to_npy_bytes(c);
    std::fs::write(path, &bytes).map_err(|e| format!("{path}: {e}"))?;
    Ok(bytes.len() as u64)
}

/// Reads one block (the task of [`from_npy_stack`]), checking its type and shape.
pub(crate) fn read_block(path: &str, dtype: DType, shape: &[u64]) -> Result<Chunk, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let c = from_npy_bytes(&bytes).map_err(|e| format!("{path}: {e}"))?;
    let want: Vec<usize> = shape.iter().map(|&n| n as usize).collect();
    if c.dtype() != dtype || c.shape() != want.as_slice() {
        return Err(format!(
            "{path}: a {} block of {:?}, the stack says {} of {want:?}",
            c.dtype().name(),
            c.shape(),
            dtype.name()
        ));
    }
    Ok(c)
}

impl Array {
    /// Writes the array to `dir` (created if missing) as one `.npy` file per block along
    /// `axis` (`0.npy`, `1.npy`, ...; the array is rechunked to whole lengths along the other
    /// axes first) and `info.json`, running the writes on `scheduler` (every worker must see
    /// `dir`). Read it back with [`from_npy_stack`], or each file with NumPy's `np.load`.
    ///
    /// ```
    /// use dask_collections::array::{self, DType};
    /// let dir = std::env::temp_dir().join(format!("npy-doc-{}", std::process::id()));
    /// let x = array::arange(0.0, 12.0, 1.0, 5, DType::I32)?;
    /// x.to_npy_stack(&dir, 0, &dask_graph::Inline)?;
    /// let y = array::from_npy_stack(&dir)?;
    /// assert_eq!((y.chunks(), y.dtype()), (x.chunks(), DType::I32));
    /// assert_eq!(y.compute(&dask_graph::Inline)?, x.compute(&dask_graph::Inline)?);
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok::<(), array::ArrayError>(())
    /// ```
    pub fn to_npy_stack(
        &self,
        dir: impl AsRef<Path>,
        axis: isize,
        scheduler: &dyn Scheduler,
    ) -> Result<(), ArrayError> {
        self.require_known("to_npy_stack")?;
        let dir = dir.as_ref();
        let ax = self.axis(axis)?;
        let chunks: Vec<Vec<usize>> = (0..self.ndim())
            .map(|a| {
                if a == ax {
                    self.chunks[a].clone()
                } else {
                    vec![self.shape[a]]
                }
            })
            .collect();
        let x = self.rechunk(chunks)?;
        std::fs::create_dir_all(dir).map_err(|e| NpyError::io(dir, &e))?;
        let name = fresh_name("to-npy");
        let mut layer = Graph::new();
        let mut keys = Vec::new();
        for i in 0..x.chunks[ax].len() {
            let mut idx = vec![0; x.ndim()];
            idx[ax] = i;
            let path = dir.join(format!("{i}.npy"));
            let k = key(&name, &[i]);
            layer.insert(
                k,
                Task::new(
                    kernels().write,
                    [
                        Arg::lit(path.to_string_lossy().into_owned()),
                        Arg::key(x.block_key(&idx)),
                    ],
                ),
            );
            keys.push(k);
        }
        let mut graph = x.graph();
        graph.extend(layer);
        let graph = dask_graph::optimize::cull(graph, &keys);
        scheduler.get(graph, &keys)?;
        let info = Info {
            axis: ax,
            chunks: x.chunks[ax].clone(),
            shape: x.shape.clone(),
            dtype: descr(x.dtype).to_string(),
        };
        let path = dir.join("info.json");
        let text = serde_json::to_string(&info).map_err(|_| NpyError::Info)?;
        std::fs::write(&path, text).map_err(|e| NpyError::io(&path, &e))?;
        Ok(())
    }
}

/// The array a [`Array::to_npy_stack`] wrote to `dir`: one block per file, read by its task
/// (each checked against `info.json`'s type and shape when it is read).
pub fn from_npy_stack(dir: impl AsRef<Path>) -> Result<Array, ArrayError> {
    let dir = dir.as_ref();
    let path = dir.join("info.json");
    let text = std::fs::read_to_string(&path).map_err(|e| NpyError::io(&path, &e))?;
    let info: Info = serde_json::from_str(&text).map_err(|_| NpyError::Info)?;
    let dtype = dtype_of(&info.dtype).ok_or(NpyError::DType {
        descr: info.dtype.clone(),
    })?;
    if info.axis >= info.shape.len() || info.chunks.iter().sum::<usize>() != info.shape[info.axis] {
        return Err(NpyError::Info.into());
    }
    super::create::check_rank(info.shape.len())?;
    let chunks: Vec<Vec<usize>> = (0..info.shape.len())
        .map(|a| {
            if a == info.axis {
                info.chunks.clone()
            } else {
                vec![info.shape[a]]
            }
        })
        .collect();
    let name = fresh_name("from-npy");
    let mut layer = Graph::new();
    for (i, &n) in info.chunks.iter().enumerate() {
        let mut idx = vec![0; info.shape.len()];
        idx[info.axis] = i;
        let mut shape: Vec<u64> = info.shape.iter().map(|&n| n as u64).collect();
        shape[info.axis] = n as u64;
        let file = dir.join(format!("{i}.npy"));
        layer.insert(
            key(&name, &idx),
            Task::new(
                kernels().read,
                [
                    Arg::lit(file.to_string_lossy().into_owned()),
                    Arg::lit(dtype),
                    Arg::lit(shape),
                ],
            ),
        );
    }
    Ok(Array::from_layer(
        name,
        info.shape,
        chunks,
        dtype,
        layer,
        &[],
    ))
}

/// The kernels of the tasks this module builds, registered in this process on first use (and by
/// [`register`](crate::array::register), which worker processes call at start).
pub(crate) struct Kernels {
    /// A block written to a `.npy` file (its bytes).
    pub write: dask_graph::Func<(String, crate::array::Block), u64>,
    /// A block read from a `.npy` file.
    pub read: dask_graph::Func<(String, crate::array::DType, Vec<u64>), crate::array::Chunk>,
}

pub(crate) fn kernels() -> &'static Kernels {
    static K: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let r = dask_graph::registry();
        Kernels {
            write: r.register(
                "dask-array-npy-write",
                |path: String, a: crate::array::Block| write_block(&path, &a),
            ),
            read: r.register(
                "dask-array-npy-read",
                |path: String, dtype: crate::array::DType, shape: Vec<u64>| {
                    read_block(&path, dtype, &shape)
                },
            ),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_through_npy_bytes() {
        for t in [
            DType::Bool,
            DType::U8,
            DType::I32,
            DType::I64,
            DType::F32,
            DType::F64,
        ] {
            for shape in [vec![], vec![3], vec![2, 3], vec![0, 4]] {
                let c = Chunk::full(&shape, t, 1.0);
                let b = to_npy_bytes(&c);
                let header_end = b.len() - c.shape().iter().product::<usize>() * t.size();
                assert_eq!(header_end % 64, 0, "{t:?} {shape:?}");
                assert_eq!(from_npy_bytes(&b).unwrap(), c);
            }
        }
    }

    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(data);
        b
    }

    #[test]
    fn fortran_order_is_transposed_on_reading() {
        // NumPy's np.asfortranarray([[1, 2, 3], [4, 5, 6]]) as int64.
        let data: Vec<u8> = [1i64, 4, 2, 5, 3, 6]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let b = npy(
            "{'descr': '<i8', 'fortran_order': True, 'shape': (2, 3), }",
            &data,
        );
        let c = from_npy_bytes(&b).unwrap();
        assert_eq!(
            c,
            Chunk::from(ndarray::arr2(&[[1i64, 2, 3], [4, 5, 6]]).into_dyn())
        );
    }

    #[test]
    fn bad_files_are_typed_errors_and_allocate_nothing() {
        assert!(matches!(from_npy_bytes(b"hello"), Err(NpyError::Magic)));
        let c = Chunk::full(&[4], DType::F64, 2.0);
        let mut b = to_npy_bytes(&c);
        b.truncate(b.len() - 1);
        assert!(matches!(
            from_npy_bytes(&b),
            Err(NpyError::Length {
                expected: 32,
                got: 31
            })
        ));
        let data = [0u8; 32];
        // A header announcing an enormous shape fails on the length check, before allocating.
        let forged = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999, 99999), }",
            &data,
        );
        assert!(matches!(
            from_npy_bytes(&forged),
            Err(NpyError::Length { .. })
        ));
        let overflow = npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (18446744073709551615, 3), }",
            &data,
        );
        assert!(matches!(
            from_npy_bytes(&overflow),
            Err(NpyError::Header(_))
        ));
        let complex = npy(
            "{'descr': '<c8', 'fortran_order': False, 'shape': (4,), }",
            &data,
        );
        assert!(matches!(
            from_npy_bytes(&complex),
            Err(NpyError::DType { .. })
        ));
        let big_endian = npy(
            "{'descr': '>f8', 'fortran_order': False, 'shape': (4,), }",
            &data,
        );
        assert!(matches!(
            from_npy_bytes(&big_endian),
            Err(NpyError::DType { .. })
        ));
        let no_shape = npy("{'descr': '<f8', 'fortran_order': False, }", &data);
        assert!(matches!(
            from_npy_bytes(&no_shape),
            Err(NpyError::Header(_))
        ));
        let short = npy("{'descr': '<f8'", &[]);
        assert!(from_npy_bytes(&short[..short.len() - 3]).is_err());
    }
}
