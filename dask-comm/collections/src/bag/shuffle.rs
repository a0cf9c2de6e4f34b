//! Operations that move items between partitions: `groupby` (a hash shuffle in the task
//! graph) and `product`.

use std::sync::Arc;

use dask_graph::{Arg, Graph, Key, Task};

use super::functions;
use super::steps::Steps;
use super::{fresh_name, kernels, Bag, BagError, Source};

/// The input of partition `i` of `a.product(b)`: partition `i / m` of `a` and `i % m` of `b`
/// (`m` the partitions of `b`), paired as they are read.
pub(super) fn pair_input(a: &Bag, b: &Bag, i: usize) -> Arg {
    let m = b.npartitions;
    Arg::List(vec![a.part_task(i / m), b.part_task(i % m)])
}

impl Bag {
    /// Groups the items by `key(item)` with a shuffle: `npartitions` output partitions (this
    /// bag's when `None`) of `[key, [items...]]` pairs, every key in exactly one partition
    /// (chosen by its hash), keys in order within a partition, a key's items in partition
    /// order. Each input partition is split once; output partition `j` gathers bucket `j`
    /// of every split.
    ///
    /// ```
    /// use dask_collections::bag::{self, Item};
    /// bag::register_map("groupby-doc-mod3", |x: &Item| Item::Int(x.as_i64().unwrap() % 3));
    /// let g = bag::range(7, 3)?.groupby("groupby-doc-mod3", Some(2))?;
    /// let mut got = g.compute(&dask_graph::Sync)?;
    /// got.sort();
    /// assert_eq!(got[0], Item::pair(0, vec![0, 3, 6]));
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn groupby(&self, key: &str, npartitions: Option<usize>) -> Result<Bag, BagError> {
        functions::map_fn(key)?;
        let n = npartitions.unwrap_or(self.npartitions);
        if n == 0 {
            return Err(BagError::NoPartitions { what: "groupby" });
        }
        let name = fresh_name("groupby");
        let (split, pick) = (format!("{name}-split"), format!("{name}-pick"));
        let mut g = Graph::new();
        for i in 0..self.npartitions {
            let [p, s] = self.input_args(i);
            g.insert(
                Key::new(&split, &[i as u32]),
                Task::new(
                    kernels::SPLIT,
                    [p, s, Arg::lit(key.to_string()), Arg::lit(n as u64)],
                ),
            );
            for j in 0..n {
                g.insert(
                    Key::new(&pick, &[i as u32, j as u32]),
                    Task::new(
                        kernels::PICK,
                        [Arg::key(Key::new(&split, &[i as u32])), Arg::lit(j as u64)],
                    ),
                );
            }
        }
        for j in 0..n {
            let picks = (0..self.npartitions)
                .map(|i| Arg::key(Key::new(&pick, &[i as u32, j as u32])))
                .collect();
            g.insert(
                Key::new(&name, &[j as u32]),
                Task::new(kernels::GROUP, [Arg::List(picks)]),
            );
        }
        Ok(Bag {
            split_every: self.split_every,
            ..Bag::new(name, n, &[&self.layers], g)
        })
    }

    /// The Cartesian product: `[a, b]` for every item `a` of this bag and `b` of `other`, in
    /// `npartitions() * other.npartitions()` partitions.
    pub fn product(&self, other: &Bag) -> Bag {
        let name = fresh_name("product");
        let n = self.npartitions * other.npartitions;
        // The pairs as tasks of their own, for whoever needs them whole (`compute`, a
        // shuffle); a reduction or a materialisation of further steps reads the input pairs
        // directly and leaves these out.
        let mut g = Graph::new();
        for i in 0..n {
            g.insert(
                Key::new(&name, &[i as u32]),
                Task::new(
                    kernels::PIPELINE,
                    [pair_input(self, other, i), Arg::lit(Steps::default())],
                ),
            );
        }
        Bag {
            split_every: self.split_every,
            source: Source::Product(Arc::new((self.clone(), other.clone()))),
            ..Bag::new(name, n, &[&self.layers, &other.layers], g)
        }
    }
}
