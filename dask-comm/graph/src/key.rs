//! Keys: an interned name and a short index tuple, like Dask's `("sum-3f2a", 4, 7)`.
//!
//! Names are interned once per process (a `u32`), so a key is a small `Copy` value that hashes
//! and compares in a few instructions; graphs of a million tasks repeat a handful of names.
//! Interned names live as long as the process (a million distinct names cost about 40 MB).
//! On the wire a key is its name's text and its indices, so processes need not agree on the
//! numbering.

use std::collections::HashMap;
use std::fmt;
use std::sync::{OnceLock, RwLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most indices a key may have (a 6-d array's chunk grid).
pub const MAX_INDICES: usize = 6;

/// An interned name: the first element of a key, or a function's name.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(u32);

struct Interner {
    ids: HashMap<&'static str, u32>,
    names: Vec<&'static str>,
}

fn interner() -> &'static RwLock<Interner> {
    static I: OnceLock<RwLock<Interner>> = OnceLock::new();
    I.get_or_init(|| {
        RwLock::new(Interner {
            ids: HashMap::new(),
            names: Vec::new(),
        })
    })
}

impl Name {
    /// The name for `text`, interned on first use.
    ///
    /// ```
    /// use dask_graph::Name;
    /// assert_eq!(Name::new("inc"), Name::new("inc"));
    /// assert_eq!(Name::new("inc").as_str(), "inc");
    /// ```
    pub fn new(text: &str) -> Name {
        if let Some(&id) = interner()
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .ids
            .get(text)
        {
            return Name(id);
        }
        let mut i = interner().write().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = i.ids.get(text) {
            return Name(id);
        }
        let id = u32::try_from(i.names.len()).expect("fewer than 2^32 distinct names");
        let text: &'static str = Box::leak(text.to_owned().into_boxed_str());
        i.ids.insert(text, id);
        i.names.push(text);
        Name(id)
    }

    /// The name's text.
    pub fn as_str(self) -> &'static str {
        interner().read().unwrap_or_else(|e| e.into_inner()).names[self.0 as usize]
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Name::new(&text))
    }
}

/// A task's key: a name and up to [`MAX_INDICES`] indices.
///
/// ```
/// use dask_graph::Key;
/// let k = Key::new("sum-3f2a", &[4, 7]);
/// assert_eq!(k.to_string(), "('sum-3f2a', 4, 7)");
/// assert_eq!(k.indices(), &[4, 7]);
/// assert_eq!(Key::name_only("total").to_string(), "total");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    name: Name,
    len: u8,
    idx: [u32; MAX_INDICES],
}

impl Key {
    /// A key of `name` and `indices`.
    ///
    /// # Panics
    /// With more than [`MAX_INDICES`] indices; use [`Key::try_new`] to get an error instead.
    pub fn new(name: &str, indices: &[u32]) -> Key {
        Key::try_new(Name::new(name), indices).expect("at most MAX_INDICES indices")
    }

    /// A key of an interned `name` and `indices`, or an error naming the limit.
    pub fn try_new(name: Name, indices: &[u32]) -> Result<Key, crate::GraphError> {
        if indices.len() > MAX_INDICES {
            return Err(crate::GraphError::TooManyIndices {
                name: name.as_str().to_string(),
                got: indices.len(),
            });
        }
        let mut idx = [0u32; MAX_INDICES];
        idx[..indices.len()].copy_from_slice(indices);
        Ok(Key {
            name,
            len: indices.len() as u8,
            idx,
        })
    }

    /// A key of `name` alone.
    pub fn name_only(name: &str) -> Key {
        Key::new(name, &[])
    }

    /// A key of an interned name and indices (at most [`MAX_INDICES`]; more are an error).
    pub fn at(name: Name, indices: &[u32]) -> Key {
        Key::try_new(name, indices).expect("at most MAX_INDICES indices")
    }

    /// The name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// The indices.
    pub fn indices(&self) -> &[u32] {
        &self.idx[..self.len as usize]
    }

    /// The name's prefix: the text before its last `-` (Dask's key prefix, which groups the
    /// tasks of one operation: `sum-3f2a` → `sum`).
    pub fn prefix(&self) -> &'static str {
        let n = self.name.as_str();
        n.rsplit_once('-').map_or(n, |(p, _)| p)
    }
}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        // Unused index slots are always zero: only the used ones (and the name) matter.
        h.write_u32(self.name.0);
        h.write_u8(self.len);
        for i in self.indices() {
            h.write_u32(*i);
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.len == 0 {
            return f.write_str(self.name.as_str());
        }
        write!(f, "('{}'", self.name)?;
        for i in self.indices() {
            write!(f, ", {i}")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for Key {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (self.name, self.indices()).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (name, idx): (Name, Vec<u32>) = Deserialize::deserialize(d)?;
        Key::try_new(name, &idx).map_err(serde::de::Error::custom)
    }
}

impl From<&str> for Key {
    fn from(name: &str) -> Key {
        Key::name_only(name)
    }
}

impl From<(&str, u32)> for Key {
    fn from((name, i): (&str, u32)) -> Key {
        Key::new(name, &[i])
    }
}

impl From<(&str, u32, u32)> for Key {
    fn from((name, i, j): (&str, u32, u32)) -> Key {
        Key::new(name, &[i, j])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_through_the_wire_by_name() {
        let k = Key::new("x-1", &[1, 2, 3]);
        let bytes = postcard::to_stdvec(&k).unwrap();
        assert_eq!(postcard::from_bytes::<Key>(&bytes).unwrap(), k);
        assert_eq!(std::mem::size_of::<Key>(), 32);
        assert_eq!(k.prefix(), "x");
        assert_eq!(Key::name_only("plain").prefix(), "plain");
    }

    #[test]
    fn too_many_indices_is_an_error() {
        assert!(Key::try_new(Name::new("a"), &[0; 7]).is_err());
        let bad = postcard::to_stdvec(&(Name::new("a"), vec![0u32; 9])).unwrap();
        assert!(postcard::from_bytes::<Key>(&bad).is_err());
    }
}
