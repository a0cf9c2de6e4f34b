//! Reductions as trees: a partial result per partition (the pending steps run as it reads),
//! combined `split_every` at a time, then finished into an item or a one-partition bag.

use std::cmp::Ordering;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::functions::{self, AggFn, BinFn, MapFn};
use super::steps::{Input, Pipeline};
use super::{Item, Part};

/// The text a task fails with when a reduction has no item to start from (mapped to
/// [`BagError::Empty`](super::BagError::Empty)).
pub(crate) const EMPTY: &str = "empty bag: ";

/// A reduction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Agg {
    Count,
    Sum,
    Mean,
    Var {
        ddof: f64,
        sqrt: bool,
    },
    Min,
    Max,
    Fold {
        binop: String,
        combine: String,
        initial: Option<Item>,
    },
    Reduction {
        per: String,
        aggregate: String,
    },
    Frequencies {
        sort: bool,
    },
    TopK {
        k: usize,
        key: Option<String>,
        largest: bool,
    },
    Distinct {
        key: Option<String>,
    },
    FoldBy {
        key: String,
        binop: String,
        initial: Option<Item>,
        combine: String,
        combine_initial: Option<Item>,
    },
}

dask_graph::serde_data!(Agg);

impl Agg {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Agg::Count => "count",
            Agg::Sum => "sum",
            Agg::Mean => "mean",
            Agg::Var { sqrt: false, .. } => "var",
            Agg::Var { sqrt: true, .. } => "std",
            Agg::Min => "min",
            Agg::Max => "max",
            Agg::Fold { .. } => "fold",
            Agg::Reduction { .. } => "reduction",
            Agg::Frequencies { .. } => "frequencies",
            Agg::TopK { .. } => "topk",
            Agg::Distinct { .. } => "distinct",
            Agg::FoldBy { .. } => "foldby",
        }
    }
}

/// A partial result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum Acc {
    Count(u64),
    Sum(Item),
    Mean {
        n: u64,
        sum: f64,
    },
    Moments {
        n: u64,
        mean: f64,
        m2: f64,
    },
    Extreme(Option<Item>),
    One(Option<Item>),
    Counts(FxHashMap<Item, u64>),
    /// `(key, item)`, best first, at most `k`.
    Top(Vec<(Item, Item)>),
    /// Key to the first item with that key (or to the accumulator of `foldby`).
    Keyed(FxHashMap<Item, Item>),
}

dask_graph::serde_data!(
    Acc,
    nbytes = |a: &Acc| match a {
        Acc::Sum(i) | Acc::Extreme(Some(i)) | Acc::One(Some(i)) => i.nbytes(),
        Acc::Counts(m) => m.keys().map(|k| k.nbytes() + 8).sum(),
        Acc::Top(v) => v.iter().map(|(k, i)| k.nbytes() + i.nbytes()).sum(),
        Acc::Keyed(m) => m.iter().map(|(k, i)| k.nbytes() + i.nbytes()).sum(),
        _ => 32,
    }
);

/// `a + b` for numbers (booleans as 0 and 1; integers stay integers until a float joins, and
/// an integer overflow is an error rather than a wrong answer).
pub(crate) fn add(a: &Item, b: &Item) -> Result<Item, String> {
    match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x
            .checked_add(y)
            .map(Item::Int)
            .ok_or_else(|| format!("integer overflow adding {x} and {y}")),
        _ => match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => Ok(Item::Float(x + y)),
            _ => Err(format!(
                "cannot add a {} and a {} ({} + {})",
                a.kind(),
                b.kind(),
                short(a),
                short(b)
            )),
        },
    }
}

fn short(x: &Item) -> String {
    let s = x.to_json();
    if s.len() > 40 {
        format!("{}...", &s[..s.floor_char_boundary(40)])
    } else {
        s
    }
}

fn number(op: &str, x: &Item) -> Result<f64, String> {
    x.as_f64()
        .ok_or_else(|| format!("{op}: a {} item is not a number ({})", x.kind(), short(x)))
}

fn map_fn(name: &str) -> Result<MapFn, String> {
    functions::map_fn(name).map_err(|e| e.to_string())
}

fn bin_fn(name: &str) -> Result<BinFn, String> {
    functions::binary(name).map_err(|e| e.to_string())
}

fn agg_fn(name: &str) -> Result<AggFn, String> {
    functions::aggregate(name).map_err(|e| e.to_string())
}

/// Best first: by key, then by the item (so ties come out the same on every scheduler).
fn top_order(largest: bool) -> impl Fn(&(Item, Item), &(Item, Item)) -> Ordering {
    move |a, b| {
        let o = a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1));
        if largest { o.reverse() } else { o }
    }
}

fn prune(v: &mut Vec<(Item, Item)>, k: usize, largest: bool) {
    let order = top_order(largest);
    if k == 0 {
        v.clear();
    } else if v.len() > k {
        v.select_nth_unstable_by(k - 1, &order);
        v.truncate(k);
    }
    v.sort_by(order);
}

/// The partial result of one partition, its steps run as it is read.
pub(crate) fn partial(agg: &Agg, steps: &Pipeline, part: Input<'_>) -> Result<Acc, String> {
    let run = |f: &mut dyn FnMut(Item) -> Result<(), String>| steps.run(part, f);
    Ok(match agg {
        Agg::Count => {
            let mut n = 0u64;
            run(&mut |_| {
                n += 1;
                Ok(())
            })?;
            Acc::Count(n)
        }
        Agg::Sum => {
            let mut s = Item::Int(0);
            run(&mut |x| {
                s = add(&s, &x)?;
                Ok(())
            })?;
            Acc::Sum(s)
        }
        Agg::Mean => {
            let (mut n, mut sum) = (0u64, 0.0);
            run(&mut |x| {
                sum += number("mean", &x)?;
                n += 1;
                Ok(())
            })?;
            Acc::Mean { n, sum }
        }
        Agg::Var { .. } => {
            // Welford's update, merged across partitions with Chan's formula.
            let (mut n, mut mean, mut m2) = (0u64, 0.0, 0.0);
            run(&mut |x| {
                let v = number("var", &x)?;
                n += 1;
                let d = v - mean;
                mean += d / n as f64;
                m2 += d * (v - mean);
                Ok(())
            })?;
            Acc::Moments { n, mean, m2 }
        }
        Agg::Min | Agg::Max => {
            let max = matches!(agg, Agg::Max);
            let mut best: Option<Item> = None;
            run(&mut |x| {
                let better = best.as_ref().is_none_or(|b| (x > *b) == max && x != *b);
                if better {
                    best = Some(x);
                }
                Ok(())
            })?;
            Acc::Extreme(best)
        }
        Agg::Fold { binop, initial, .. } => {
            let f = bin_fn(binop)?;
            let mut acc = initial.clone();
            run(&mut |x| {
                acc = Some(match acc.take() {
                    Some(a) => f(a, &x)?,
                    None => x,
                });
                Ok(())
            })?;
            Acc::One(acc)
        }
        Agg::Reduction { per, .. } => {
            let f = agg_fn(per)?;
            Acc::One(Some(f(steps.collect(part)?.0)?))
        }
        Agg::Frequencies { .. } => {
            let mut m: FxHashMap<Item, u64> = FxHashMap::default();
            run(&mut |x| {
                *m.entry(x).or_insert(0) += 1;
                Ok(())
            })?;
            Acc::Counts(m)
        }
        Agg::TopK { k, key, largest } => {
            let key = key.as_deref().map(map_fn).transpose()?;
            let mut v: Vec<(Item, Item)> = Vec::new();
            run(&mut |x| {
                let kx = match &key {
                    Some(f) => f(&x)?,
                    None => x.clone(),
                };
                v.push((kx, x));
                if v.len() >= (*k).max(512).saturating_mul(2) {
                    prune(&mut v, *k, *largest);
                }
                Ok(())
            })?;
            prune(&mut v, *k, *largest);
            Acc::Top(v)
        }
        Agg::Distinct { key } => {
            let key = key.as_deref().map(map_fn).transpose()?;
            let mut m: FxHashMap<Item, Item> = FxHashMap::default();
            run(&mut |x| {
                match &key {
                    Some(f) => {
                        m.entry(f(&x)?).or_insert(x);
                    }
                    None => {
                        m.entry(x).or_insert(Item::Null);
                    }
                }
                Ok(())
            })?;
            Acc::Keyed(m)
        }
        Agg::FoldBy {
            key,
            binop,
            initial,
            ..
        } => {
            let (key, f) = (map_fn(key)?, bin_fn(binop)?);
            let mut m: FxHashMap<Item, Item> = FxHashMap::default();
            run(&mut |x| {
                let k = key(&x)?;
                match m.remove(&k) {
                    Some(a) => {
                        let a = f(a, &x)?;
                        m.insert(k, a);
                    }
                    None => {
                        let a = match initial {
                            Some(i) => f(i.clone(), &x)?,
                            None => x,
                        };
                        m.insert(k, a);
                    }
                }
                Ok(())
            })?;
            Acc::Keyed(m)
        }
    })
}

fn mismatch(agg: &Agg, a: &Acc) -> String {
    format!("{}: an unexpected partial result {a:?}", agg.name())
}

/// Several partial results (in partition order) as one.
pub(crate) fn combine(agg: &Agg, accs: Vec<Acc>) -> Result<Acc, String> {
    let mut it = accs.into_iter();
    let Some(mut acc) = it.next() else {
        return Err(format!("{}: nothing to combine", agg.name()));
    };
    let aggregate = match agg {
        Agg::Reduction { aggregate, .. } => Some(agg_fn(aggregate)?),
        _ => None,
    };
    if let (Some(f), Acc::One(first)) = (&aggregate, &mut acc) {
        // Dask's `reduction`: the aggregate takes the whole list of partial results.
        let mut all: Vec<Item> = first.take().into_iter().collect();
        for b in it {
            match b {
                Acc::One(x) => all.extend(x),
                other => return Err(mismatch(agg, &other)),
            }
        }
        return Ok(Acc::One(Some(f(all)?)));
    }
    let combine = match agg {
        Agg::Fold { combine, .. } => Some(bin_fn(combine)?),
        Agg::FoldBy { combine, .. } => Some(bin_fn(combine)?),
        _ => None,
    };
    for b in it {
        acc = match (acc, b) {
            (Acc::Count(x), Acc::Count(y)) => Acc::Count(x + y),
            (Acc::Sum(x), Acc::Sum(y)) => Acc::Sum(add(&x, &y)?),
            (Acc::Mean { n, sum }, Acc::Mean { n: m, sum: s }) => Acc::Mean {
                n: n + m,
                sum: sum + s,
            },
            (
                Acc::Moments { n, mean, m2 },
                Acc::Moments {
                    n: nb,
                    mean: mb,
                    m2: m2b,
                },
            ) => {
                if nb == 0 {
                    Acc::Moments { n, mean, m2 }
                } else if n == 0 {
                    Acc::Moments {
                        n: nb,
                        mean: mb,
                        m2: m2b,
                    }
                } else {
                    let t = (n + nb) as f64;
                    let d = mb - mean;
                    Acc::Moments {
                        n: n + nb,
                        mean: mean + d * nb as f64 / t,
                        m2: m2 + m2b + d * d * n as f64 * nb as f64 / t,
                    }
                }
            }
            (Acc::Extreme(x), Acc::Extreme(y)) => Acc::Extreme(match (x, y) {
                (Some(x), Some(y)) => Some(match (x.cmp(&y), agg) {
                    (Ordering::Less, Agg::Max) | (Ordering::Greater, Agg::Min) => y,
                    _ => x,
                }),
                (x, y) => x.or(y),
            }),
            (Acc::One(x), Acc::One(y)) => Acc::One(match (x, y) {
                (Some(x), Some(y)) => Some((combine.as_ref().expect("fold combines"))(x, &y)?),
                (x, y) => x.or(y),
            }),
            (Acc::Counts(mut x), Acc::Counts(y)) => {
                for (k, c) in y {
                    *x.entry(k).or_insert(0) += c;
                }
                Acc::Counts(x)
            }
            (Acc::Top(mut x), Acc::Top(y)) => {
                let Agg::TopK { k, largest, .. } = agg else {
                    return Err(mismatch(agg, &Acc::Top(y)));
                };
                x.extend(y);
                prune(&mut x, *k, *largest);
                Acc::Top(x)
            }
            (Acc::Keyed(mut x), Acc::Keyed(y)) => {
                match &combine {
                    // Foldby: the accumulators of a key combined in partition order
                    // (`combine_initial` joins once, when the reduction finishes).
                    Some(f) => {
                        for (k, b) in y {
                            let a = match x.remove(&k) {
                                Some(a) => f(a, &b)?,
                                None => b,
                            };
                            x.insert(k, a);
                        }
                    }
                    None => {
                        // Distinct: the earlier partition's item stays.
                        for (k, v) in y {
                            x.entry(k).or_insert(v);
                        }
                    }
                }
                Acc::Keyed(x)
            }
            (a, _) => return Err(mismatch(agg, &a)),
        };
    }
    Ok(acc)
}

fn empty(agg: &Agg) -> String {
    format!("{EMPTY}{} of no items", agg.name())
}

/// The result of an item-valued reduction.
pub(crate) fn finish_item(agg: &Agg, acc: Acc) -> Result<Item, String> {
    Ok(match (agg, acc) {
        (_, Acc::Count(n)) => Item::Int(n as i64),
        (_, Acc::Sum(s)) => s,
        (_, Acc::Mean { n: 0, .. }) | (_, Acc::Moments { n: 0, .. }) => return Err(empty(agg)),
        (_, Acc::Mean { n, sum }) => Item::Float(sum / n as f64),
        (Agg::Var { ddof, sqrt }, Acc::Moments { n, m2, .. }) => {
            let v = m2 / (n as f64 - ddof);
            Item::Float(if *sqrt { v.sqrt() } else { v })
        }
        (_, Acc::Extreme(x)) | (_, Acc::One(x)) => x.ok_or_else(|| empty(agg))?,
        (agg, a) => return Err(mismatch(agg, &a)),
    })
}

/// The result of a bag-valued reduction: one partition, in a fixed order (frequencies by
/// item, or by count, largest first, with `sort`; topk best first; distinct and foldby by key).
pub(crate) fn finish_part(agg: &Agg, acc: Acc) -> Result<Part, String> {
    Ok(Part(match (agg, acc) {
        (Agg::Frequencies { sort }, Acc::Counts(m)) => {
            let mut v: Vec<(Item, u64)> = m.into_iter().collect();
            if *sort {
                v.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            } else {
                v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            }
            v.into_iter()
                .map(|(x, n)| Item::pair(x, Item::Int(n as i64)))
                .collect()
        }
        (Agg::TopK { .. }, Acc::Top(v)) => v.into_iter().map(|(_, x)| x).collect(),
        (Agg::Distinct { key }, Acc::Keyed(m)) => {
            let mut v: Vec<(Item, Item)> = m.into_iter().collect();
            v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            if key.is_some() {
                v.into_iter().map(|(_, x)| x).collect()
            } else {
                v.into_iter().map(|(k, _)| k).collect()
            }
        }
        (
            Agg::FoldBy {
                combine_initial,
                combine,
                ..
            },
            Acc::Keyed(m),
        ) => {
            let f = bin_fn(combine)?;
            let mut v: Vec<(Item, Item)> = m.into_iter().collect();
            v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            v.into_iter()
                .map(|(k, a)| {
                    let a = match combine_initial {
                        Some(i) => f(i.clone(), &a)?,
                        None => a,
                    };
                    Ok(Item::pair(k, a))
                })
                .collect::<Result<_, String>>()?
        }
        (agg, a) => return Err(mismatch(agg, &a)),
    }))
}
