//! Bag functions every process has without registering them (Python's built-ins and string
//! methods as Dask bags use them).

use std::collections::HashMap;
use std::sync::Arc;

use super::Item;
use super::functions::Func;
use super::reduce::add;

/// `json.loads`: a string item parsed as JSON.
pub const JSON_LOADS: &str = "json.loads";
/// `json.dumps`: any item as compact JSON text.
pub const JSON_DUMPS: &str = "json.dumps";
/// `str.split()`: a string split on whitespace, into a list of strings.
pub const STR_SPLIT: &str = "str.split";
/// `str.lower()`.
pub const STR_LOWER: &str = "str.lower";
/// `str.upper()`.
pub const STR_UPPER: &str = "str.upper";
/// `str.strip()`: leading and trailing whitespace removed.
pub const STR_STRIP: &str = "str.strip";
/// `len`: characters of a string, elements of a list, fields of a map.
pub const LEN: &str = "len";
/// The item itself (a key function grouping by the whole item).
pub const IDENTITY: &str = "identity";
/// Numeric addition (a binary function: `fold(ADD, ...)`).
pub const ADD: &str = "add";
/// Python's truthiness: false for null, false, 0, 0.0, and empty strings, lists and maps.
pub const TRUTHY: &str = "bool";
/// A string with something other than whitespace in it (a predicate; `read_json` skips the
/// lines it is false for).
pub const NOT_BLANK: &str = "str.nonblank";

fn string<'a>(what: &str, x: &'a Item) -> Result<&'a str, String> {
    x.as_str()
        .ok_or_else(|| format!("{what}: a {} item is not a string", x.kind()))
}

fn truthy(x: &Item) -> bool {
    match x {
        Item::Null => false,
        Item::Bool(b) => *b,
        Item::Int(i) => *i != 0,
        Item::Float(f) => *f != 0.0,
        Item::Str(s) => !s.is_empty(),
        Item::List(l) => !l.is_empty(),
        Item::Map(m) => !m.is_empty(),
    }
}

pub(crate) fn all() -> HashMap<String, Func> {
    let map = |f: fn(&Item) -> Result<Item, String>| Func::Map(Arc::new(f));
    let mut t = HashMap::new();
    t.insert(
        JSON_LOADS.into(),
        map(|x| Item::from_json(string(JSON_LOADS, x)?).map_err(|e| format!("json.loads: {e}"))),
    );
    t.insert(JSON_DUMPS.into(), map(|x| Ok(Item::from(x.to_json()))));
    t.insert(
        STR_SPLIT.into(),
        map(|x| {
            Ok(Item::List(
                string(STR_SPLIT, x)?
                    .split_whitespace()
                    .map(Item::str)
                    .collect(),
            ))
        }),
    );
    t.insert(
        STR_LOWER.into(),
        map(|x| Ok(Item::from(string(STR_LOWER, x)?.to_lowercase()))),
    );
    t.insert(
        STR_UPPER.into(),
        map(|x| Ok(Item::from(string(STR_UPPER, x)?.to_uppercase()))),
    );
    t.insert(
        STR_STRIP.into(),
        map(|x| Ok(Item::from(string(STR_STRIP, x)?.trim()))),
    );
    t.insert(
        LEN.into(),
        map(|x| {
            let n = match x {
                Item::Str(s) => s.chars().count(),
                Item::List(l) => l.len(),
                Item::Map(m) => m.len(),
                other => return Err(format!("len: a {} item has no length", other.kind())),
            };
            Ok(Item::Int(n as i64))
        }),
    );
    t.insert(IDENTITY.into(), map(|x| Ok(x.clone())));
    t.insert(
        TRUTHY.into(),
        Func::Predicate(Arc::new(|x: &Item| Ok(truthy(x)))),
    );
    t.insert(
        NOT_BLANK.into(),
        Func::Predicate(Arc::new(|x: &Item| {
            Ok(string(NOT_BLANK, x)?.chars().any(|c| !c.is_whitespace()))
        })),
    );
    t.insert(
        ADD.into(),
        Func::Binary(Arc::new(|a: Item, x: &Item| add(&a, x))),
    );
    t
}
