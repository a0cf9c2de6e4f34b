//! The functions a bag applies to its items, registered by name in every process (a graph
//! names them and never ships code, as with every task function), and the built-in ones.
//!
//! A function is registered as one of five kinds, and a bag operation refuses a function of
//! another kind (or an unknown name) when the operation is built, naming it:
//!
//! | kind | signature | used by |
//! |---|---|---|
//! | map | `Fn(&Item) -> Item` | `map`, keys of `groupby`, `foldby`, `topk_by`, `distinct_by` |
//! | predicate | `Fn(&Item) -> bool` | `filter`, `remove` |
//! | binary | `Fn(Item, &Item) -> Item` | `fold`, `foldby` (accumulator, then item) |
//! | partition | `Fn(Vec<Item>) -> Vec<Item>` | `map_partitions` |
//! | aggregate | `Fn(Vec<Item>) -> Item` | `reduction` (per partition, and over partial results) |
//!
//! Each may instead return `Result<_, E>` with `E: Display`: an `Err` fails the task with its
//! text. A panic fails the task too (the schedulers catch it).
//!
//! ```
//! use dask_collections::bag::{self, Item};
//! bag::register_map("fn-doc-square", |x: &Item| Item::Int(x.as_i64().unwrap_or(0).pow(2)));
//! bag::register_predicate("fn-doc-odd", |x: &Item| x.as_i64().is_some_and(|i| i % 2 == 1));
//! let b = bag::range(10, 3)?.filter("fn-doc-odd")?.map("fn-doc-square")?;
//! assert_eq!(b.sum().compute(&dask_graph::Inline)?, Item::Int(1 + 9 + 25 + 49 + 81));
//! # Ok::<(), bag::BagError>(())
//! ```

use std::fmt;
use std::sync::{Arc, Once};

use dask_graph::registry;

use super::{BagError, Item};

/// What a registered function returns: its value, or the text of its failure.
pub trait Outcome<T> {
    /// The value or the failure's text.
    fn outcome(self) -> Result<T, String>;
}

impl<T> Outcome<T> for T {
    fn outcome(self) -> Result<T, String> {
        Ok(self)
    }
}

impl<T, E: fmt::Display> Outcome<T> for Result<T, E> {
    fn outcome(self) -> Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

pub(crate) type MapFn = Arc<dyn Fn(&Item) -> Result<Item, String> + Send + Sync>;
pub(crate) type PredFn = Arc<dyn Fn(&Item) -> Result<bool, String> + Send + Sync>;
pub(crate) type BinFn = Arc<dyn Fn(Item, &Item) -> Result<Item, String> + Send + Sync>;
pub(crate) type PartFn = Arc<dyn Fn(Vec<Item>) -> Result<Vec<Item>, String> + Send + Sync>;
pub(crate) type AggFn = Arc<dyn Fn(Vec<Item>) -> Result<Item, String> + Send + Sync>;

/// The kinds of bag function as types, for [`BagFn`] handles: an operation that needs a
/// predicate takes a `BagFn<kind::Predicate>` (or a name), and a map function's handle does
/// not compile there.
pub mod kind {
    /// `Fn(&Item) -> Item`.
    #[derive(Debug)]
    pub enum Map {}
    /// `Fn(&Item) -> bool`.
    #[derive(Debug)]
    pub enum Predicate {}
    /// `Fn(Item, &Item) -> Item`.
    #[derive(Debug)]
    pub enum Binary {}
    /// `Fn(Vec<Item>) -> Vec<Item>`.
    #[derive(Debug)]
    pub enum Partition {}
    /// `Fn(Vec<Item>) -> Item`.
    #[derive(Debug)]
    pub enum Aggregate {}
}

/// A registered bag function's handle: its name, and its kind in its type (`K`, one of
/// [`kind`]'s). Returned by the `register_*` functions; cheap to copy.
///
/// ```
/// use dask_collections::bag::{self, Item};
/// let odd = bag::register_predicate("handle-doc-odd", |x: &Item| x.as_i64().is_some_and(|i| i % 2 == 1));
/// let b = bag::range(10, 3)?.filter(odd)?;
/// assert_eq!(b.count().compute(&dask_graph::Inline)?, Item::Int(5));
/// # Ok::<(), bag::BagError>(())
/// ```
///
/// A handle of another kind does not compile:
///
/// ```compile_fail
/// use dask_collections::bag::{self, Item};
/// let square = bag::register_map("handle-doc-square", |x: &Item| x.clone());
/// let b = bag::range(10, 3).unwrap().filter(square);
/// ```
pub struct BagFn<K> {
    name: &'static str,
    kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> BagFn<K> {
    fn new(name: &str) -> BagFn<K> {
        BagFn {
            name: dask_graph::Name::new(name).as_str(),
            kind: std::marker::PhantomData,
        }
    }

    /// The function's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl<K> Clone for BagFn<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for BagFn<K> {}

impl<K> fmt::Debug for BagFn<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BagFn({})", self.name)
    }
}

impl<K> PartialEq for BagFn<K> {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

/// A bag function as an operation names it: a [`BagFn`] handle of the kind the operation
/// needs (checked as it compiles), or a name (`&str`, `String`; checked when the operation is
/// built, [`BagError::UnknownFunction`], [`BagError::WrongKind`]).
pub trait BagFunction<K> {
    /// The function's name.
    fn bag_name(&self) -> &str;
}

impl<K> BagFunction<K> for BagFn<K> {
    fn bag_name(&self) -> &str {
        self.name
    }
}

impl<K> BagFunction<K> for &BagFn<K> {
    fn bag_name(&self) -> &str {
        self.name
    }
}

impl<K> BagFunction<K> for &str {
    fn bag_name(&self) -> &str {
        self
    }
}

impl<K> BagFunction<K> for String {
    fn bag_name(&self) -> &str {
        self
    }
}

impl<K> BagFunction<K> for &String {
    fn bag_name(&self) -> &str {
        self
    }
}

/// A registered function.
#[derive(Clone)]
pub(crate) enum Func {
    Map(MapFn),
    Predicate(PredFn),
    Binary(BinFn),
    Partition(PartFn),
    Aggregate(AggFn),
}

/// The kinds of bag function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Fn(&Item) -> Item`.
    Map,
    /// `Fn(&Item) -> bool`.
    Predicate,
    /// `Fn(Item, &Item) -> Item`.
    Binary,
    /// `Fn(Vec<Item>) -> Vec<Item>`.
    Partition,
    /// `Fn(Vec<Item>) -> Item`.
    Aggregate,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Map => "a map function (&Item -> Item)",
            Kind::Predicate => "a predicate (&Item -> bool)",
            Kind::Binary => "a binary function (Item, &Item -> Item)",
            Kind::Partition => "a partition function (Vec<Item> -> Vec<Item>)",
            Kind::Aggregate => "an aggregate (Vec<Item> -> Item)",
        })
    }
}

impl Func {
    fn kind(&self) -> Kind {
        match self {
            Func::Map(_) => Kind::Map,
            Func::Predicate(_) => Kind::Predicate,
            Func::Binary(_) => Kind::Binary,
            Func::Partition(_) => Kind::Partition,
            Func::Aggregate(_) => Kind::Aggregate,
        }
    }
}

/// A bag function as the process's registry holds it: the function, and whether it is the
/// built-in one of its name.
struct Registered {
    f: Func,
    builtin: bool,
}

/// The name a bag function has in the process's one registry: bag functions (of `&Item`, not
/// task values) are qualified, `bag:{name}`, so that the bag's `add` and a task function
/// `add` are two names, and a name cannot mean one thing to a task and another to a bag.
fn wire(name: &str) -> String {
    format!("bag:{name}")
}

/// The built-in functions, registered once per process before any other bag function (so
/// none can take a built-in's name).
fn builtins() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (name, f) in super::builtins::all() {
            // One place registers them all: never two of one name.
            let r = registry().register_native(&wire(&name), Registered { f, builtin: true });
            if let Err(e) = r {
                tracing::error!(%e, "a built-in bag function's name was taken");
            }
        }
    });
}

fn registered(name: &str) -> Option<Arc<Registered>> {
    builtins();
    registry().native::<Registered>(wire(name).as_str())
}

/// Whether `name` names a built-in function (a pipeline may then run it in a fused form).
pub(crate) fn is_builtin(name: &str) -> bool {
    registered(name).is_some_and(|r| r.builtin)
}

/// Registers `f` under `name` in the process's registry.
///
/// # Panics
///
/// When another place in the code registered a bag function of that name (a built-in's
/// included): the message names both places, as `dask_graph::Registry::register`'s does.
#[track_caller]
fn insert(name: &str, f: Func) {
    builtins();
    tracing::trace!(name, "registered a bag function");
    if let Err(e) = registry().register_native(&wire(name), Registered { f, builtin: false }) {
        panic!("{e}");
    }
}

/// Registers a map function under `name`.
///
/// # Panics
///
/// When another place in the code registered a bag function of that name, a built-in's
/// included (the message names both places). The same place registering again (a
/// `register()` run twice) keeps the first.
#[track_caller]
pub fn register_map<R, F>(name: &str, f: F) -> BagFn<kind::Map>
where
    R: Outcome<Item>,
    F: Fn(&Item) -> R + Send + Sync + 'static,
{
    insert(name, Func::Map(Arc::new(move |x| f(x).outcome())));
    BagFn::new(name)
}

/// Registers a predicate under `name` (panics as [`register_map`]).
#[track_caller]
pub fn register_predicate<R, F>(name: &str, f: F) -> BagFn<kind::Predicate>
where
    R: Outcome<bool>,
    F: Fn(&Item) -> R + Send + Sync + 'static,
{
    insert(name, Func::Predicate(Arc::new(move |x| f(x).outcome())));
    BagFn::new(name)
}

/// Registers a binary function (an accumulator and an item) under `name` (panics as
/// [`register_map`]).
#[track_caller]
pub fn register_binary<R, F>(name: &str, f: F) -> BagFn<kind::Binary>
where
    R: Outcome<Item>,
    F: Fn(Item, &Item) -> R + Send + Sync + 'static,
{
    insert(name, Func::Binary(Arc::new(move |a, x| f(a, x).outcome())));
    BagFn::new(name)
}

/// Registers a partition function under `name` (panics as [`register_map`]).
#[track_caller]
pub fn register_partition<R, F>(name: &str, f: F) -> BagFn<kind::Partition>
where
    R: Outcome<Vec<Item>>,
    F: Fn(Vec<Item>) -> R + Send + Sync + 'static,
{
    insert(name, Func::Partition(Arc::new(move |x| f(x).outcome())));
    BagFn::new(name)
}

/// Registers an aggregate (a list of items to one item) under `name` (panics as
/// [`register_map`]).
#[track_caller]
pub fn register_aggregate<R, F>(name: &str, f: F) -> BagFn<kind::Aggregate>
where
    R: Outcome<Item>,
    F: Fn(Vec<Item>) -> R + Send + Sync + 'static,
{
    insert(name, Func::Aggregate(Arc::new(move |x| f(x).outcome())));
    BagFn::new(name)
}

/// The function registered under `name`, of kind `kind`.
pub(crate) fn lookup(name: &str, kind: Kind) -> Result<Func, BagError> {
    match registered(name).as_deref().map(|r| &r.f) {
        Some(f) if f.kind() == kind => Ok(f.clone()),
        Some(f) => Err(BagError::WrongKind {
            name: name.to_string(),
            expected: kind,
            registered: f.kind(),
        }),
        None => Err(BagError::UnknownFunction {
            name: name.to_string(),
            expected: kind,
        }),
    }
}

pub(crate) fn map_fn(name: &str) -> Result<MapFn, BagError> {
    match lookup(name, Kind::Map)? {
        Func::Map(f) => Ok(f),
        _ => unreachable!("kind checked"),
    }
}

pub(crate) fn predicate(name: &str) -> Result<PredFn, BagError> {
    match lookup(name, Kind::Predicate)? {
        Func::Predicate(f) => Ok(f),
        _ => unreachable!("kind checked"),
    }
}

pub(crate) fn binary(name: &str) -> Result<BinFn, BagError> {
    match lookup(name, Kind::Binary)? {
        Func::Binary(f) => Ok(f),
        _ => unreachable!("kind checked"),
    }
}

pub(crate) fn partition(name: &str) -> Result<PartFn, BagError> {
    match lookup(name, Kind::Partition)? {
        Func::Partition(f) => Ok(f),
        _ => unreachable!("kind checked"),
    }
}

pub(crate) fn aggregate(name: &str) -> Result<AggFn, BagError> {
    match lookup(name, Kind::Aggregate)? {
        Func::Aggregate(f) => Ok(f),
        _ => unreachable!("kind checked"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register_square() {
        register_map("fn-test-square", |x: &Item| {
            Item::Int(x.as_i64().unwrap_or(0).pow(2))
        });
    }

    #[test]
    fn names_are_taken_once_and_built_ins_stay() {
        register_square();
        register_square(); // the same place again: kept
        assert!(map_fn("fn-test-square").is_ok());
        // Another place: refused, naming both.
        let e = std::panic::catch_unwind(|| register_map("fn-test-square", |x: &Item| x.clone()))
            .unwrap_err();
        let text = e.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            text.contains("bag:fn-test-square") && text.contains("functions.rs"),
            "{text}"
        );
        // A built-in cannot be replaced, and still runs as itself.
        assert!(
            std::panic::catch_unwind(|| register_binary(super::super::ADD, |a: Item, _: &Item| a))
                .is_err()
        );
        assert!(is_builtin(super::super::ADD));
        // Kinds are still checked, and a bag function is not a task function (nor the reverse).
        assert!(matches!(
            predicate("fn-test-square"),
            Err(BagError::WrongKind { .. })
        ));
        assert!(registry().get("bag:fn-test-square").is_none());
        assert!(
            map_fn("identity").is_ok(),
            "the bag's identity, beside the graph's"
        );
        assert!(registry().get("identity").is_some());
    }
}
