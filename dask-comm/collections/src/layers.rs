//! Layered graphs for the bag and the dataframe: a collection holds the layers it stands on by
//! name, and builds the graph of just the keys a computation asks for.

use std::collections::BTreeMap;
use std::sync::Arc;

use dask_graph::{Graph, Key};

/// A fresh layer name: `prefix-` and 16 random hex digits.
pub(crate) fn fresh_name(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

pub(crate) type Layers = Arc<BTreeMap<String, Arc<Graph>>>;

/// Every layer of `inputs`, and `layer` under `name`.
pub(crate) fn stack(inputs: &[&Layers], name: &str, layer: Graph) -> Layers {
    let mut all = BTreeMap::new();
    for l in inputs {
        all.extend(l.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    // A layer may hold several named stages (a reduction's partial and combine tasks, a
    // shuffle's splits): each name finds it.
    let mut names: Vec<&'static str> = layer.iter().map(|(k, _)| k.name().as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let layer = Arc::new(layer);
    for n in names.into_iter().filter(|n| *n != name) {
        all.insert(n.to_string(), layer.clone());
    }
    all.insert(name.to_string(), layer);
    Arc::new(all)
}

/// The tasks `keys` need, from `layers`.
pub(crate) fn graph_for(layers: &Layers, keys: &[Key]) -> Graph {
    let mut g = Graph::new();
    let mut seen = std::collections::HashSet::new();
    let mut todo: Vec<Key> = keys.to_vec();
    while let Some(k) = todo.pop() {
        if !seen.insert(k) {
            continue;
        }
        let Some(node) = layers.get(k.name().as_str()).and_then(|l| l.get(&k)) else {
            continue;
        };
        todo.extend(
            node.dependencies()
                .into_iter()
                .filter(|d| !seen.contains(d)),
        );
        g.insert(k, node.clone());
    }
    g
}

/// The id of the peer-to-peer shuffle of layer `name`.
pub(crate) fn shuffle_id(name: &str) -> dask_graph::ShuffleId {
    dask_graph::ShuffleId::new(&format!("{name}-shuffle"))
}

/// The tasks of a peer-to-peer shuffle into `g` (a bag's groupby, a dataframe's hash join
/// and range partitioning): transfer `i` of `inputs` (key `(name-transfer, i)`) is
/// `transfer(i)`; the barrier over them (`name-barrier`); output `j` of `outputs` (key
/// `(name, j)`) is `unpack(barrier, j)`, which must take the barrier as an argument. The
/// roles the scheduler and workers run the shuffle by are set here.
pub(crate) fn p2p_shuffle(
    g: &mut Graph,
    name: &str,
    inputs: u32,
    outputs: u32,
    transfer: impl Fn(u32) -> dask_graph::Task,
    unpack: impl Fn(dask_graph::Arg, u32) -> dask_graph::Task,
) {
    use dask_graph::{Arg, ShuffleRole};
    let id = shuffle_id(name);
    let transfers: Vec<Key> = (0..inputs)
        .map(|i| {
            let key = Key::new(&format!("{name}-transfer"), &[i]);
            g.insert(
                key,
                transfer(i).with_shuffle(ShuffleRole::Transfer { id, input: i }),
            );
            key
        })
        .collect();
    let barrier = Key::name_only(&format!("{name}-barrier"));
    g.insert(barrier, dask_graph::shuffle::barrier(id, transfers));
    for j in 0..outputs {
        g.insert(
            Key::new(name, &[j]),
            unpack(Arg::key(barrier), j).with_shuffle(ShuffleRole::Unpack { id, part: j }),
        );
    }
}
