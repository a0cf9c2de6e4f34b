//! Operations that move items between partitions: `groupby` (a hash shuffle, peer-to-peer
//! or made of tasks) and `product`.

use std::sync::Arc;

use dask_graph::{Arg, Graph, Key, Task};

use crate::ShuffleMethod;
use crate::layers::{p2p_shuffle, shuffle_id};

use super::functions::{self, BagFunction, kind};
use super::steps::Steps;
use super::{Bag, BagError, Source, fresh_name, kernels};

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
    /// of every split. The buckets move on the peer-to-peer shuffle (as
    /// [`groupby_with`](Self::groupby_with) with [`ShuffleMethod::P2p`]).
    ///
    /// ```
    /// use dask_collections::bag::{self, Item};
    /// bag::register_map("groupby-doc-mod3", |x: &Item| Item::Int(x.as_i64().unwrap() % 3));
    /// let g = bag::range(7, 3)?.groupby("groupby-doc-mod3", Some(2))?;
    /// let mut got = g.compute(&dask_graph::Inline)?;
    /// got.sort();
    /// assert_eq!(got[0], Item::pair(0, vec![0, 3, 6]));
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn groupby(
        &self,
        key: impl BagFunction<kind::Map>,
        npartitions: Option<usize>,
    ) -> Result<Bag, BagError> {
        self.groupby_with(key, npartitions, ShuffleMethod::P2p)
    }

    /// [`groupby`](Self::groupby), the buckets moved by `method`: peer-to-peer (each
    /// partition's transfer task sends its buckets to the workers of their outputs, outside
    /// the task graph), or as tasks (a task per bucket per partition, `n × m` of them).
    ///
    /// ```
    /// use dask_collections::{bag::{self, Item}, ShuffleMethod};
    /// bag::register_map("groupby-with-doc-odd", |x: &Item| Item::Bool(x.as_i64().unwrap() % 2 == 1));
    /// let g = bag::range(5, 2)?.groupby_with("groupby-with-doc-odd", None, ShuffleMethod::Tasks)?;
    /// let mut got = g.compute(&dask_graph::Inline)?;
    /// got.sort();
    /// assert_eq!(got[1], Item::pair(true, vec![1, 3]));
    /// # Ok::<(), bag::BagError>(())
    /// ```
    pub fn groupby_with(
        &self,
        key: impl BagFunction<kind::Map>,
        npartitions: Option<usize>,
        method: ShuffleMethod,
    ) -> Result<Bag, BagError> {
        let key = key.bag_name();
        functions::map_fn(key)?;
        let n = npartitions.unwrap_or(self.npartitions);
        if n == 0 {
            return Err(BagError::NoPartitions { what: "groupby" });
        }
        let name = fresh_name("groupby");
        let mut g = Graph::new();
        match method {
            ShuffleMethod::P2p => self.p2p_groupby(key, &name, n, &mut g),
            ShuffleMethod::Tasks => self.task_groupby(key, &name, n, &mut g),
        }
        Ok(Bag {
            split_every: self.split_every,
            ..Bag::new(name, n, &[&self.layers], g)
        })
    }

    /// A peer-to-peer groupby's tasks: a transfer per partition, the barrier, an unpack per
    /// output.
    fn p2p_groupby(&self, key: &str, name: &str, n: usize, g: &mut Graph) {
        let shuffle = shuffle_id(name).as_str().to_string();
        let inputs = self.npartitions as u32;
        p2p_shuffle(
            g,
            name,
            inputs,
            n as u32,
            |i| {
                let [p, s] = self.input_args(i as usize);
                Task::new(
                    kernels::GROUP_TRANSFER,
                    [
                        p,
                        s,
                        Arg::lit(key.to_string()),
                        Arg::lit(n as u64),
                        Arg::lit(shuffle.clone()),
                        Arg::lit(u64::from(i)),
                    ],
                )
            },
            |barrier, j| {
                Task::new(
                    kernels::GROUP_UNPACK,
                    [
                        barrier,
                        Arg::lit(shuffle.clone()),
                        Arg::lit(u64::from(j)),
                        Arg::lit(u64::from(inputs)),
                    ],
                )
            },
        );
    }

    /// A groupby made of tasks: a split per partition, a pick per bucket, a group per output.
    fn task_groupby(&self, key: &str, name: &str, n: usize, g: &mut Graph) {
        let (split, pick) = (format!("{name}-split"), format!("{name}-pick"));
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
                Key::new(name, &[j as u32]),
                Task::new(kernels::GROUP, [Arg::List(picks)]),
            );
        }
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
