//! Item-wise steps (`map`, `filter`, `flatten`, `pluck`, `map_partitions`) are not tasks of
//! their own: a bag keeps the steps it has been given since its last materialised layer, and
//! the task that consumes a partition (a reduction's partial, a shuffle's split, a write, or a
//! plain materialisation) runs them item by item as it reads, so a chain of element-wise
//! operations makes one task per partition and no intermediate lists (Dask fuses these chains
//! after building them; here they are never built apart).

use serde::{Deserialize, Serialize};

use super::functions::{self, MapFn, PartFn, PredFn};
use dask_graph::{List, Value};

use super::{BagError, Item, Part, STR_SPLIT};

/// A field of an item to pluck: a map's field by name, or a list's element by position
/// (negative from the end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Field {
    /// A map's field.
    Name(String),
    /// A list's element.
    Index(i64),
}

impl From<&str> for Field {
    fn from(s: &str) -> Field {
        Field::Name(s.to_string())
    }
}

impl From<String> for Field {
    fn from(s: String) -> Field {
        Field::Name(s)
    }
}

impl From<i64> for Field {
    fn from(i: i64) -> Field {
        Field::Index(i)
    }
}

impl From<i32> for Field {
    fn from(i: i32) -> Field {
        Field::Index(i64::from(i))
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Field::Name(n) => write!(f, "{n:?}"),
            Field::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// What a task reads a partition from: a partition, or two whose pairs are the partition
/// (a `product`'s, made as they are read).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Input<'a> {
    Part(&'a Part),
    Product(&'a Part, &'a Part),
}

impl<'a> Input<'a> {
    /// The input in a task argument.
    pub(crate) fn of(v: &'a Value) -> Result<Input<'a>, String> {
        if let Some(p) = v.downcast_ref::<Part>() {
            return Ok(Input::Part(p));
        }
        if let Some([a, b]) = v.downcast_ref::<List>().map(|l| &l.0[..])
            && let (Some(a), Some(b)) = (a.downcast_ref::<Part>(), b.downcast_ref::<Part>())
        {
            return Ok(Input::Product(a, b));
        }
        Err(format!(
            "a bag partition expected, the task got a {}",
            v.type_info().name()
        ))
    }

    /// Every item, in order.
    fn each(self, f: &mut dyn FnMut(Item) -> Result<(), String>) -> Result<(), String> {
        match self {
            Input::Part(p) => p.0.iter().try_for_each(|x| f(x.clone())),
            Input::Product(a, b) => a.0.iter().try_for_each(|x| {
                b.0.iter()
                    .try_for_each(|y| f(Item::pair(x.clone(), y.clone())))
            }),
        }
    }
}

/// Where a pipeline hands the items that come out of it.
pub(crate) type Sink<'a> = &'a mut dyn FnMut(Item) -> Result<(), String>;

/// One pending step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Step {
    Map(String),
    Filter(String),
    Remove(String),
    Flatten,
    Pluck { field: Field, default: Option<Item> },
    Partition(String),
}

/// The steps a task runs, as a task argument.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Steps(pub Vec<Step>);

dask_graph::serde_data!(Steps, nbytes = |s: &Steps| 24 + s.0.len() * 48);

impl Steps {
    /// Checks every function the steps name (at build time, in the building process).
    pub(crate) fn check(step: &Step) -> Result<(), BagError> {
        match step {
            Step::Map(f) => functions::map_fn(f).map(drop),
            Step::Filter(f) | Step::Remove(f) => functions::predicate(f).map(drop),
            Step::Partition(f) => functions::partition(f).map(drop),
            Step::Flatten | Step::Pluck { .. } => Ok(()),
        }
    }
}

enum Compiled {
    Map(MapFn),
    /// `map(str.split)` then `flatten`: the words of a string, without the list between.
    Words,
    Filter(PredFn, bool),
    Flatten,
    Pluck(Field, Option<Item>),
}

/// A segment of item-wise steps, then (except for the last) a partition function.
struct Segment {
    items: Vec<Compiled>,
    then: Option<PartFn>,
}

/// The steps with their functions looked up, ready to run over partitions.
pub(crate) struct Pipeline {
    segments: Vec<Segment>,
}

fn pluck(item: Item, field: &Field, default: &Option<Item>) -> Result<Item, String> {
    let got = match (&item, field) {
        (Item::Map(m), Field::Name(n)) => m.get(n).cloned(),
        (Item::List(_), Field::Index(i)) => item.at(*i).cloned(),
        (other, _) => {
            return default.clone().ok_or_else(|| {
                format!("pluck {field}: the item is a {}, not a {}", other.kind(), {
                    if matches!(field, Field::Name(_)) {
                        "map"
                    } else {
                        "list"
                    }
                })
            });
        }
    };
    got.or_else(|| default.clone()).ok_or_else(|| match &item {
        Item::List(l) => format!("pluck {field}: out of range for a list of {}", l.len()),
        _ => format!("pluck {field}: no such field in the item"),
    })
}

impl Pipeline {
    /// Looks up every function (a task on a worker: an unknown name fails the task, naming it).
    pub(crate) fn new(steps: &Steps) -> Result<Pipeline, String> {
        let mut segments = vec![Segment {
            items: Vec::new(),
            then: None,
        }];
        let mut it = steps.0.iter().peekable();
        while let Some(s) = it.next() {
            let last = segments.last_mut().expect("one segment at least");
            if matches!(s, Step::Map(f) if f == STR_SPLIT && functions::is_builtin(f))
                && it.next_if(|n| **n == Step::Flatten).is_some()
            {
                last.items.push(Compiled::Words);
                continue;
            }
            match s {
                Step::Map(f) => last.items.push(Compiled::Map(
                    functions::map_fn(f).map_err(|e| e.to_string())?,
                )),
                Step::Filter(f) | Step::Remove(f) => last.items.push(Compiled::Filter(
                    functions::predicate(f).map_err(|e| e.to_string())?,
                    matches!(s, Step::Filter(_)),
                )),
                Step::Flatten => last.items.push(Compiled::Flatten),
                Step::Pluck { field, default } => last
                    .items
                    .push(Compiled::Pluck(field.clone(), default.clone())),
                Step::Partition(f) => {
                    last.then = Some(functions::partition(f).map_err(|e| e.to_string())?);
                    segments.push(Segment {
                        items: Vec::new(),
                        then: None,
                    });
                }
            }
        }
        Ok(Pipeline { segments })
    }

    /// Runs the steps over `input`, handing every item that comes out to `out`.
    pub(crate) fn run(&self, input: Input<'_>, out: Sink<'_>) -> Result<(), String> {
        let (last, whole) = self.segments.split_last().expect("one segment at least");
        if whole.is_empty() {
            return input.each(&mut |x| push(&last.items, x, out));
        }
        let mut items = Vec::new();
        input.each(&mut |x| {
            items.push(x);
            Ok(())
        })?;
        for seg in whole {
            let mut next = Vec::new();
            for x in items {
                push(&seg.items, x, &mut |y| {
                    next.push(y);
                    Ok(())
                })?;
            }
            items = (seg
                .then
                .as_ref()
                .expect("a partition step ends the segment"))(next)?;
        }
        for x in items {
            push(&last.items, x, out)?;
        }
        Ok(())
    }

    /// Runs the steps over `input` and collects what comes out.
    pub(crate) fn collect(&self, input: Input<'_>) -> Result<Part, String> {
        let mut v = Vec::new();
        self.run(input, &mut |x| {
            v.push(x);
            Ok(())
        })?;
        Ok(Part(v))
    }
}

fn push(steps: &[Compiled], x: Item, out: Sink<'_>) -> Result<(), String> {
    let Some((first, rest)) = steps.split_first() else {
        return out(x);
    };
    match first {
        Compiled::Map(f) => push(rest, f(&x)?, out),
        Compiled::Filter(p, keep) => {
            if p(&x)? == *keep {
                push(rest, x, out)
            } else {
                Ok(())
            }
        }
        Compiled::Words => match &x {
            Item::Str(s) => s
                .split_whitespace()
                .try_for_each(|w| push(rest, Item::str(w), out)),
            other => Err(format!(
                "{STR_SPLIT}: a {} item is not a string",
                other.kind()
            )),
        },
        Compiled::Flatten => match x {
            Item::List(l) => l.iter().try_for_each(|y| push(rest, y.clone(), out)),
            other => Err(format!("flatten: a {} item is not a list", other.kind())),
        },
        Compiled::Pluck(field, default) => push(rest, pluck(x, field, default)?, out),
    }
}
