//! Reductions of a bag: to one item (`count`, `sum`, `fold`, ...) or to a one-partition bag
//! (`frequencies`, `topk`, `distinct`, `foldby`), each a tree of partial results combined
//! `split_every` at a time.

use dask_graph::{Arg, Graph, Key, Task};

use super::functions::{self, BagFunction, kind};
use super::reduce::Agg;
use super::{Bag, BagError, Item, Scalar, fresh_name, kernels, stack};

impl Bag {
    /// The partial results, the combining tree, and the key of the single combined one.
    fn tree(&self, agg: &Agg, prefix: &str) -> (Graph, Key, String) {
        let name = fresh_name(prefix);
        let partial = format!("{name}-partial");
        let mut g = Graph::new();
        let mut level: Vec<Key> = (0..self.npartitions)
            .map(|i| {
                let k = Key::new(&partial, &[i as u32]);
                let [p, s] = self.input_args(i);
                g.insert(
                    k,
                    Task::new(kernels::PARTIAL, [p, s, Arg::lit(agg.clone())]),
                );
                k
            })
            .collect();
        // At least one combining task, so that a reduction's aggregate always runs.
        let mut depth = 0u32;
        while level.len() > 1 || depth == 0 {
            let combine = format!("{name}-combine");
            level = level
                .chunks(self.split_every)
                .enumerate()
                .map(|(j, group)| {
                    let k = Key::new(&combine, &[depth, j as u32]);
                    let mut args = vec![Arg::lit(agg.clone())];
                    args.extend(group.iter().map(|&k| Arg::key(k)));
                    g.insert(k, Task::new(kernels::COMBINE, args));
                    k
                })
                .collect();
            depth += 1;
        }
        (g, level[0], name)
    }

    fn reduce_item(&self, agg: Agg) -> Scalar {
        let (mut g, top, name) = self.tree(&agg, agg.name());
        let key = Key::new(&name, &[]);
        g.insert(
            key,
            Task::new(kernels::FINISH_ITEM, [Arg::lit(agg), Arg::key(top)]),
        );
        Scalar {
            key,
            layers: stack(&[&self.layers], &name, g),
        }
    }

    fn reduce_bag(&self, agg: Agg) -> Bag {
        let (mut g, top, name) = self.tree(&agg, agg.name());
        g.insert(
            Key::new(&name, &[0]),
            Task::new(kernels::FINISH_PART, [Arg::lit(agg), Arg::key(top)]),
        );
        Bag {
            split_every: self.split_every,
            ..Bag::new(name, 1, &[&self.layers], g)
        }
    }

    /// The number of items.
    pub fn count(&self) -> Scalar {
        self.reduce_item(Agg::Count)
    }

    /// The sum of the items (numbers; booleans count as 0 and 1). Integers stay integers
    /// (an overflow fails the computation); a float anywhere makes the sum a float.
    pub fn sum(&self) -> Scalar {
        self.reduce_item(Agg::Sum)
    }

    /// The mean of the items (numbers), a float.
    pub fn mean(&self) -> Scalar {
        self.reduce_item(Agg::Mean)
    }

    /// The variance of the items with `ddof` degrees of freedom (Welford's and Chan's
    /// algorithms: stable across partitions).
    pub fn var(&self, ddof: f64) -> Scalar {
        self.reduce_item(Agg::Var { ddof, sqrt: false })
    }

    /// The standard deviation.
    pub fn std(&self, ddof: f64) -> Scalar {
        self.reduce_item(Agg::Var { ddof, sqrt: true })
    }

    /// The smallest item, in [`Item`]'s total order.
    pub fn min(&self) -> Scalar {
        self.reduce_item(Agg::Min)
    }

    /// The largest item.
    pub fn max(&self) -> Scalar {
        self.reduce_item(Agg::Max)
    }

    /// Folds the items of each partition with `binop` (from `initial`, or from the
    /// partition's first item), then folds those results with `combine` ([`Kind::Binary`]
    /// both; Dask's `fold`).
    ///
    /// ```
    /// use dask_collections::bag::{self, Item};
    /// let b = bag::range(5, 2)?;
    /// let s = b.fold(bag::ADD, None, Some(Item::Int(100)))?.compute(&dask_graph::Inline)?;
    /// assert_eq!(s, Item::Int(200 + 10)); // 100 starts each of the two partitions
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn fold(
        &self,
        binop: impl BagFunction<kind::Binary>,
        combine: Option<&str>,
        initial: Option<Item>,
    ) -> Result<Scalar, BagError> {
        let binop = binop.bag_name();
        functions::binary(binop)?;
        let combine = combine.unwrap_or(binop);
        functions::binary(combine)?;
        Ok(self.reduce_item(Agg::Fold {
            binop: binop.into(),
            combine: combine.into(),
            initial,
        }))
    }

    /// `perpartition` over each partition's items, then `aggregate` over the list of those
    /// results, `split_every` at a time up a tree ([`Kind::Aggregate`] both; Dask's
    /// `reduction`).
    pub fn reduction(
        &self,
        perpartition: impl BagFunction<kind::Aggregate>,
        aggregate: impl BagFunction<kind::Aggregate>,
    ) -> Result<Scalar, BagError> {
        let (perpartition, aggregate) = (perpartition.bag_name(), aggregate.bag_name());
        functions::aggregate(perpartition)?;
        functions::aggregate(aggregate)?;
        Ok(self.reduce_item(Agg::Reduction {
            per: perpartition.into(),
            aggregate: aggregate.into(),
        }))
    }

    /// `[item, count]` pairs, one per distinct item, in one partition: by item, or by count
    /// (largest first, then by item) with `sort`.
    pub fn frequencies(&self, sort: bool) -> Bag {
        self.reduce_bag(Agg::Frequencies { sort })
    }

    /// The `k` largest items, largest first (ties broken by the order of the items).
    pub fn topk(&self, k: usize) -> Bag {
        self.reduce_bag(Agg::TopK {
            k,
            key: None,
            largest: true,
        })
    }

    /// The `k` items with the largest `key(item)` ([`Kind::Map`]), largest first.
    pub fn topk_by(&self, k: usize, key: impl BagFunction<kind::Map>) -> Result<Bag, BagError> {
        let key = key.bag_name();
        functions::map_fn(key)?;
        Ok(self.reduce_bag(Agg::TopK {
            k,
            key: Some(key.into()),
            largest: true,
        }))
    }

    /// The `k` smallest items, smallest first.
    pub fn bottomk(&self, k: usize) -> Bag {
        self.reduce_bag(Agg::TopK {
            k,
            key: None,
            largest: false,
        })
    }

    /// The distinct items, in one partition, in order.
    pub fn distinct(&self) -> Bag {
        self.reduce_bag(Agg::Distinct { key: None })
    }

    /// The first item (in partition order) of each distinct `key(item)`, ordered by key.
    pub fn distinct_by(&self, key: impl BagFunction<kind::Map>) -> Result<Bag, BagError> {
        let key = key.bag_name();
        functions::map_fn(key)?;
        Ok(self.reduce_bag(Agg::Distinct {
            key: Some(key.into()),
        }))
    }

    /// Dask's `foldby` (a group-by and reduction in one pass, without a shuffle): the items
    /// of each `key(item)` folded with `binop` (from `initial`, or the key's first item) in
    /// each partition, then the partitions' accumulators of a key folded with `combine`
    /// (`binop` when `None`; from `combine_initial`, or the first of them). One partition of
    /// `[key, value]` pairs, ordered by key.
    ///
    /// ```
    /// use dask_collections::bag::{self, Item};
    /// bag::register_map("foldby-doc-parity", |x: &Item| Item::Int(x.as_i64().unwrap() % 2));
    /// let b = bag::range(10, 3)?.foldby("foldby-doc-parity", bag::ADD, None, None, None)?;
    /// assert_eq!(
    ///     b.compute(&dask_graph::Inline)?,
    ///     vec![Item::pair(0, 20), Item::pair(1, 25)]
    /// );
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn foldby(
        &self,
        key: impl BagFunction<kind::Map>,
        binop: impl BagFunction<kind::Binary>,
        initial: Option<Item>,
        combine: Option<&str>,
        combine_initial: Option<Item>,
    ) -> Result<Bag, BagError> {
        let (key, binop) = (key.bag_name(), binop.bag_name());
        functions::map_fn(key)?;
        functions::binary(binop)?;
        let combine = combine.unwrap_or(binop);
        functions::binary(combine)?;
        Ok(self.reduce_bag(Agg::FoldBy {
            key: key.into(),
            binop: binop.into(),
            initial,
            combine: combine.into(),
            combine_initial,
        }))
    }
}
