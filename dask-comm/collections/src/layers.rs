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
