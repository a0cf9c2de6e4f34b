//! [`Item`]: the one element type of a bag, a self-describing value as JSON's (null, booleans,
//! numbers, strings, lists, maps) with integers kept apart from floats.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One element of a bag: what a text line, a JSON record or a tuple becomes.
///
/// Strings, lists and maps are shared (`Arc`): cloning an item, plucking a field or pairing
/// two records (`product`) copies pointers, never the data.
///
/// Items compare and hash as Python values do where it matters to a bag: `Int(1) == Float(1.0)`
/// (and they hash alike, so `frequencies` and `distinct` count them together), and every item
/// has a place in one total order (null, then booleans, then numbers by value, then strings,
/// then lists, then maps; NaN after every other number), so `min`, `max`, `topk` and sorting
/// never fail on mixed items.
///
/// ```
/// use dask_collections::bag::Item;
/// let r = Item::from_json(r#"{"name": "Ada", "age": 36, "tags": ["x", 2.5]}"#).unwrap();
/// assert_eq!(r.get("age"), Some(&Item::Int(36)));
/// assert_eq!(r.get("tags").and_then(|t| t.at(1)), Some(&Item::Float(2.5)));
/// assert_eq!(Item::Int(1), Item::Float(1.0));
/// assert!(Item::from("b") > Item::Int(1_000));
/// assert_eq!(Item::list([Item::from("x"), Item::Int(2)]).to_json(), r#"["x",2]"#);
/// ```
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub enum Item {
    /// No value (JSON's `null`).
    #[default]
    Null,
    /// A boolean.
    Bool(bool),
    /// A signed 64-bit integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(Arc<str>),
    /// A list (JSON arrays, tuples, pairs).
    List(Arc<[Item]>),
    /// A map from field names (JSON objects), ordered by name.
    Map(Arc<BTreeMap<String, Item>>),
}

dask_graph::serde_data!(Item, nbytes = |i: &Item| i.nbytes());

impl Item {
    /// A list of items.
    pub fn list(items: impl IntoIterator<Item = Item>) -> Item {
        Item::List(items.into_iter().collect())
    }

    /// A string item.
    pub fn str(s: &str) -> Item {
        Item::Str(Arc::from(s))
    }

    /// A pair (a list of two), as `frequencies` and `groupby` return.
    pub fn pair(a: impl Into<Item>, b: impl Into<Item>) -> Item {
        Item::List(Arc::new([a.into(), b.into()]))
    }

    /// A map from `(field, value)` pairs.
    pub fn map<K: Into<String>>(fields: impl IntoIterator<Item = (K, Item)>) -> Item {
        Item::Map(Arc::new(
            fields.into_iter().map(|(k, v)| (k.into(), v)).collect(),
        ))
    }

    /// Parses one JSON value.
    pub fn from_json(text: &str) -> Result<Item, serde_json::Error> {
        serde_json::from_str::<serde_json::Value>(text).map(Item::from)
    }

    /// The item as compact JSON (a NaN or infinite float becomes `null`, as JSON has none).
    pub fn to_json(&self) -> String {
        serde_json::Value::from(self).to_string()
    }

    /// Converts any serde value (a struct becomes a map, a tuple a list).
    pub fn from_serde<T: Serialize + ?Sized>(value: &T) -> Result<Item, serde_json::Error> {
        serde_json::to_value(value).map(Item::from)
    }

    /// Converts to any serde type (a map to a struct, a list to a tuple or a vector).
    pub fn to_serde<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(serde_json::Value::from(self))
    }

    /// The field `name` of a map.
    pub fn get(&self, name: &str) -> Option<&Item> {
        match self {
            Item::Map(m) => m.get(name),
            _ => None,
        }
    }

    /// Element `i` of a list (negative counts from the end).
    pub fn at(&self, i: i64) -> Option<&Item> {
        match self {
            Item::List(l) => {
                let i = if i < 0 { l.len() as i64 + i } else { i };
                usize::try_from(i).ok().and_then(|i| l.get(i))
            }
            _ => None,
        }
    }

    /// The number, as a float (booleans are 0 and 1, as in Python).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Item::Int(i) => Some(i as f64),
            Item::Float(f) => Some(f),
            Item::Bool(b) => Some(f64::from(u8::from(b))),
            _ => None,
        }
    }

    /// The integer (booleans are 0 and 1; floats are not integers here).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Item::Int(i) => Some(i),
            Item::Bool(b) => Some(i64::from(b)),
            _ => None,
        }
    }

    /// The string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Item::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The list's elements.
    pub fn as_list(&self) -> Option<&[Item]> {
        match self {
            Item::List(l) => Some(l),
            _ => None,
        }
    }

    /// The kind of item, for messages: `"null"`, `"bool"`, `"int"`, `"float"`, `"str"`,
    /// `"list"` or `"map"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Item::Null => "null",
            Item::Bool(_) => "bool",
            Item::Int(_) => "int",
            Item::Float(_) => "float",
            Item::Str(_) => "str",
            Item::List(_) => "list",
            Item::Map(_) => "map",
        }
    }

    /// Bytes held, for memory accounting.
    pub fn nbytes(&self) -> usize {
        std::mem::size_of::<Item>()
            + match self {
                Item::Str(s) => s.len(),
                Item::List(l) => l.iter().map(Item::nbytes).sum(),
                Item::Map(m) => m.iter().map(|(k, v)| k.len() + 24 + v.nbytes()).sum(),
                _ => 0,
            }
    }

    /// The rank of the item's kind in the total order (numbers share one).
    fn rank(&self) -> u8 {
        match self {
            Item::Null => 0,
            Item::Bool(_) => 1,
            Item::Int(_) | Item::Float(_) => 2,
            Item::Str(_) => 3,
            Item::List(_) => 4,
            Item::Map(_) => 5,
        }
    }
}

/// `i` against `f`, exactly (no rounding of large integers); NaN is above every integer.
fn cmp_int_float(i: i64, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Less;
    }
    // 2^63 as a float: every i64 is below it, and every float below -2^63 is below every i64.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f >= TWO_63 {
        return Ordering::Less;
    }
    if f < -TWO_63 {
        return Ordering::Greater;
    }
    let t = f.trunc();
    // In range: the truncation is an exact i64.
    match i.cmp(&(t as i64)) {
        Ordering::Equal => 0.0f64.partial_cmp(&(f - t)).unwrap_or(Ordering::Equal),
        o => o,
    }
}

/// Floats by value, -0.0 equal to 0.0, NaN above everything and equal to itself.
fn cmp_float(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

impl Ord for Item {
    fn cmp(&self, other: &Item) -> Ordering {
        use Item::*;
        match (self, other) {
            (Null, Null) => Ordering::Equal,
            (Bool(a), Bool(b)) => a.cmp(b),
            (Int(a), Int(b)) => a.cmp(b),
            (Float(a), Float(b)) => cmp_float(*a, *b),
            (Int(a), Float(b)) => cmp_int_float(*a, *b),
            (Float(a), Int(b)) => cmp_int_float(*b, *a).reverse(),
            (Str(a), Str(b)) => a.cmp(b),
            (List(a), List(b)) => a.cmp(b),
            (Map(a), Map(b)) => a.iter().cmp(b.iter()),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for Item {
    fn partial_cmp(&self, other: &Item) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Item {
    fn eq(&self, other: &Item) -> bool {
        // The common cases without ordering (hash maps of words and keys compare here).
        match (self, other) {
            (Item::Str(a), Item::Str(b)) => a == b,
            (Item::Int(a), Item::Int(b)) => a == b,
            _ => self.cmp(other) == Ordering::Equal,
        }
    }
}

impl Eq for Item {}

impl Hash for Item {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // Equal items hash alike: a float that is an exact integer hashes as that integer,
        // every NaN alike, -0.0 as 0.
        match self {
            Item::Null => h.write_u8(0),
            Item::Bool(b) => {
                h.write_u8(1);
                b.hash(h)
            }
            Item::Int(i) => {
                h.write_u8(2);
                i.hash(h)
            }
            Item::Float(f) => {
                h.write_u8(2);
                let t = f.trunc();
                if t == *f && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&t) {
                    (t as i64).hash(h)
                } else if f.is_nan() {
                    h.write_u64(u64::MAX)
                } else {
                    f.to_bits().hash(h)
                }
            }
            Item::Str(s) => {
                h.write_u8(3);
                s.hash(h)
            }
            Item::List(l) => {
                h.write_u8(4);
                l.hash(h)
            }
            Item::Map(m) => {
                h.write_u8(5);
                m.hash(h)
            }
        }
    }
}

impl fmt::Display for Item {
    /// Strings as they are; everything else as JSON.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Item::Str(s) => f.write_str(s),
            other => f.write_str(&other.to_json()),
        }
    }
}

impl From<serde_json::Value> for Item {
    fn from(v: serde_json::Value) -> Item {
        use serde_json::Value as J;
        match v {
            J::Null => Item::Null,
            J::Bool(b) => Item::Bool(b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Item::Int(i),
                None => Item::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Item::Str(s.into()),
            J::Array(a) => Item::List(a.into_iter().map(Item::from).collect()),
            J::Object(o) => Item::Map(Arc::new(
                o.into_iter().map(|(k, v)| (k, Item::from(v))).collect(),
            )),
        }
    }
}

impl From<&Item> for serde_json::Value {
    fn from(i: &Item) -> serde_json::Value {
        use serde_json::Value as J;
        match i {
            Item::Null => J::Null,
            Item::Bool(b) => J::Bool(*b),
            Item::Int(i) => J::from(*i),
            Item::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
            Item::Str(s) => J::String(s.to_string()),
            Item::List(l) => J::Array(l.iter().map(J::from).collect()),
            Item::Map(m) => J::Object(m.iter().map(|(k, v)| (k.clone(), J::from(v))).collect()),
        }
    }
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Item {
            fn from(v: $t) -> Item {
                Item::Int(i64::from(v))
            }
        }
    )*};
}
from_int!(i8, i16, i32, i64, u8, u16, u32);

impl From<f64> for Item {
    fn from(v: f64) -> Item {
        Item::Float(v)
    }
}

impl From<f32> for Item {
    fn from(v: f32) -> Item {
        Item::Float(f64::from(v))
    }
}

impl From<bool> for Item {
    fn from(v: bool) -> Item {
        Item::Bool(v)
    }
}

impl From<&str> for Item {
    fn from(v: &str) -> Item {
        Item::Str(Arc::from(v))
    }
}

impl From<String> for Item {
    fn from(v: String) -> Item {
        Item::Str(Arc::from(v))
    }
}

impl<T: Into<Item>> From<Vec<T>> for Item {
    fn from(v: Vec<T>) -> Item {
        Item::List(v.into_iter().map(Into::into).collect())
    }
}

impl<T: Into<Item>> From<Option<T>> for Item {
    fn from(v: Option<T>) -> Item {
        v.map_or(Item::Null, Into::into)
    }
}

impl<A: Into<Item>, B: Into<Item>> From<(A, B)> for Item {
    fn from((a, b): (A, B)) -> Item {
        Item::pair(a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn h(i: &Item) -> u64 {
        let mut s = DefaultHasher::new();
        i.hash(&mut s);
        s.finish()
    }

    #[test]
    fn numbers_compare_exactly_across_kinds() {
        let big = 1i64 << 53;
        assert!(Item::Int(big + 1) > Item::Float(big as f64));
        assert_eq!(Item::Int(big), Item::Float(big as f64));
        assert!(Item::Int(i64::MAX) < Item::Float(9.3e18));
        assert!(Item::Int(i64::MIN) > Item::Float(-9.3e18));
        assert!(Item::Int(2) < Item::Float(2.5));
        assert!(Item::Int(-2) > Item::Float(-2.5));
        assert!(Item::Float(f64::NAN) > Item::Int(i64::MAX));
        assert_eq!(Item::Float(f64::NAN), Item::Float(f64::NAN));
        assert_eq!(Item::Float(-0.0), Item::Int(0));
        assert_eq!(h(&Item::Float(-0.0)), h(&Item::Int(0)));
        assert_eq!(h(&Item::Float(3.0)), h(&Item::Int(3)));
        assert_ne!(h(&Item::Float(3.5)), h(&Item::Int(3)));
        assert!(Item::Null < Item::Bool(false) && Item::Bool(true) < Item::Int(-5));
        assert!(Item::Float(1e300) < Item::from("") && Item::from("z") < Item::list([]));
    }

    #[test]
    fn json_round_trips_and_serde_converts() {
        let text = r#"{"a":[1,2.5,null,true,"s"],"b":{"c":-3}}"#;
        let i = Item::from_json(text).unwrap();
        assert_eq!(i.to_json(), text);
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct P {
            name: String,
            age: u32,
        }
        let p = P {
            name: "Ada".into(),
            age: 36,
        };
        let item = Item::from_serde(&p).unwrap();
        assert_eq!(item.get("age"), Some(&Item::Int(36)));
        assert_eq!(item.to_serde::<P>().unwrap(), p);
        assert!(Item::from_json("{").is_err());
        assert_eq!(Item::Float(f64::NAN).to_json(), "null");
    }
}
