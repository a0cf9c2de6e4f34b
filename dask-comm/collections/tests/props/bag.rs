//! The bag against the same computation on one Rust iterator: random items and partitionings,
//! every operation, on the `Inline` and `Threaded` schedulers and on an in-process
//! `LocalCluster` (values cross the workers encoded, as between processes).

use std::collections::{BTreeMap, HashMap};

use crate::common::{cluster, schedulers};
use dask_collections::ShuffleMethod;
use dask_collections::bag::{self, Bag, BagError, Item};
use dask_graph::Scheduler;
use proptest::prelude::*;

fn register() {
    bag::register();
    bag::register_map("t-mod7", |x: &Item| {
        Item::Int(x.as_i64().unwrap().rem_euclid(7))
    });
    bag::register_map("t-neg", |x: &Item| Item::Int(-x.as_i64().unwrap()));
    bag::register_map("t-record", |x: &Item| {
        let i = x.as_i64().unwrap();
        Item::map([
            ("id", Item::Int(i)),
            ("parts", Item::list((0..i.rem_euclid(3)).map(Item::Int))),
        ])
    });
    bag::register_predicate("t-even", |x: &Item| x.as_i64().unwrap() % 2 == 0);
    bag::register_binary(
        "t-max",
        |a: Item, x: &Item| if *x > a { x.clone() } else { a },
    );
    bag::register_aggregate("t-sumsq", |xs: Vec<Item>| {
        Item::Int(xs.iter().map(|x| x.as_i64().unwrap().pow(2)).sum())
    });
    bag::register_aggregate("t-total", |xs: Vec<Item>| {
        Item::Int(xs.iter().map(|x| x.as_i64().unwrap()).sum())
    });
    bag::register_map("t-fails", |x: &Item| -> Result<Item, String> {
        Err(format!("refused {x}"))
    });
    bag::register_map("t-panics", |_: &Item| -> Item {
        panic!("t-panics went off")
    });
    bag::register_predicate("t-first-bigger", |p: &Item| p.at(0) > p.at(1));
    bag::register_map("t-first-bigger-key", |p: &Item| {
        Item::Bool(p.at(0) > p.at(1))
    });
    bag::register_partition("t-reverse", |mut xs: Vec<Item>| {
        xs.reverse();
        xs
    });
}

/// Every scheduler, the in-process cluster last.
fn each(mut f: impl FnMut(&str, &dyn Scheduler)) {
    register();
    for (name, s) in schedulers() {
        f(name, s.as_ref());
    }
    f("cluster", cluster());
}

fn ints(xs: &[i64]) -> Vec<Item> {
    xs.iter().copied().map(Item::Int).collect()
}

fn data() -> impl Strategy<Value = (Vec<i64>, usize)> {
    (prop::collection::vec(-50i64..50, 0..60), 1usize..9)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn element_wise_steps_and_scalars((xs, n) in data(), split in 2usize..5) {
        register();
        let b = bag::from_sequence(ints(&xs), n).unwrap().split_every(split);
        let evens: Vec<i64> = xs.iter().copied().filter(|x| x % 2 == 0).collect();
        let chain = b.filter("t-even").unwrap().map("t-neg").unwrap();
        let want_chain: Vec<Item> = evens.iter().map(|x| Item::Int(-x)).collect();
        let records = b.map("t-record").unwrap();
        let flat: Vec<i64> = xs.iter().flat_map(|x| 0..x.rem_euclid(3)).collect();
        each(|name, s| {
            assert_eq!(b.compute(s).unwrap(), ints(&xs), "{name}");
            assert_eq!(chain.compute(s).unwrap(), want_chain, "{name}");
            assert_eq!(b.remove("t-even").unwrap().count().compute(s).unwrap(),
                Item::Int((xs.len() - evens.len()) as i64), "{name}");
            assert_eq!(records.pluck("id").compute(s).unwrap(), ints(&xs), "{name}");
            assert_eq!(records.pluck("parts").flatten().compute(s).unwrap(), ints(&flat), "{name}");
            assert_eq!(b.count().compute(s).unwrap(), Item::Int(xs.len() as i64), "{name}");
            assert_eq!(b.sum().compute(s).unwrap(), Item::Int(xs.iter().sum()), "{name}");
            assert_eq!(b.fold(bag::ADD, None, None).map(|f| f.compute(s)).unwrap().ok(),
                (!xs.is_empty()).then(|| Item::Int(xs.iter().sum())), "{name}");
            assert_eq!(b.reduction("t-total", "t-total").unwrap().compute(s).unwrap(),
                Item::Int(xs.iter().sum()), "{name}");
            if xs.is_empty() {
                for r in [b.min(), b.max(), b.mean()] {
                    let e = r.compute(s).unwrap_err();
                    assert!(matches!(e, BagError::Empty { .. }), "{name}: {e}");
                }
                return;
            }
            assert_eq!(b.min().compute(s).unwrap(), Item::Int(*xs.iter().min().unwrap()));
            assert_eq!(b.max().compute(s).unwrap(), Item::Int(*xs.iter().max().unwrap()));
            assert_eq!(b.fold("t-max", None, None).unwrap().compute(s).unwrap(),
                Item::Int(*xs.iter().max().unwrap()), "{name}");
            let nf = xs.len() as f64;
            let mean = xs.iter().sum::<i64>() as f64 / nf;
            let var = xs.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / nf;
            let close = |a: Item, b: f64| (a.as_f64().unwrap() - b).abs() <= 1e-9 * b.abs().max(1.0);
            assert!(close(b.mean().compute(s).unwrap(), mean), "{name}");
            assert!(close(b.var(0.0).compute(s).unwrap(), var), "{name}");
            assert!(close(b.std(0.0).compute(s).unwrap(), var.sqrt()), "{name}");
        });
    }

    #[test]
    fn bag_valued_reductions((xs, n) in data(), k in 0usize..8) {
        register();
        let b = bag::from_sequence(ints(&xs), n).unwrap();
        let mut counts: BTreeMap<i64, i64> = BTreeMap::new();
        for &x in &xs {
            *counts.entry(x).or_default() += 1;
        }
        let freq: Vec<Item> = counts.iter().map(|(&x, &c)| Item::pair(x, c)).collect();
        let mut by_count: Vec<(i64, i64)> = counts.iter().map(|(&x, &c)| (x, c)).collect();
        by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut sorted = xs.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let top: Vec<Item> = ints(&sorted[..k.min(sorted.len())]);
        sorted.reverse();
        let bottom: Vec<Item> = ints(&sorted[..k.min(sorted.len())]);
        let distinct: Vec<Item> = counts.keys().map(|&x| Item::Int(x)).collect();
        let mut by_mod: BTreeMap<i64, i64> = BTreeMap::new();
        let mut groups: HashMap<i64, Vec<i64>> = HashMap::new();
        let mut first_of_mod: BTreeMap<i64, i64> = BTreeMap::new();
        for &x in &xs {
            *by_mod.entry(x.rem_euclid(7)).or_default() += x;
            groups.entry(x.rem_euclid(7)).or_default().push(x);
            first_of_mod.entry(x.rem_euclid(7)).or_insert(x);
        }
        let foldby: Vec<Item> = by_mod.iter().map(|(&k, &v)| Item::pair(k, v + 1000)).collect();
        each(|name, s| {
            assert_eq!(b.frequencies(false).compute(s).unwrap(), freq, "{name}");
            let got = b.frequencies(true).compute(s).unwrap();
            let want: Vec<Item> = by_count.iter().map(|&(x, c)| Item::pair(x, c)).collect();
            assert_eq!(got, want, "{name}");
            assert_eq!(b.topk(k).compute(s).unwrap(), top, "{name}");
            assert_eq!(b.bottomk(k).compute(s).unwrap(), bottom, "{name}");
            assert_eq!(b.distinct().compute(s).unwrap(), distinct, "{name}");
            let firsts: Vec<Item> = first_of_mod.values().map(|&x| Item::Int(x)).collect();
            assert_eq!(b.distinct_by("t-mod7").unwrap().compute(s).unwrap(), firsts, "{name}");
            let fb = b.foldby("t-mod7", bag::ADD, Some(Item::Int(0)), None, Some(Item::Int(1000)));
            assert_eq!(fb.unwrap().compute(s).unwrap(), foldby, "{name}");
            for (out, method) in [(1, ShuffleMethod::P2p), (3, ShuffleMethod::P2p),
                                  (1, ShuffleMethod::Tasks), (3, ShuffleMethod::Tasks)] {
                let g = b.groupby_with("t-mod7", Some(out), method).unwrap();
                assert_eq!(g.npartitions(), out);
                let mut got = g.compute(s).unwrap();
                got.sort();
                let mut want: Vec<Item> = groups.iter()
                    .map(|(&k, v)| Item::pair(k, ints(v)))
                    .collect();
                want.sort();
                assert_eq!(got, want, "{name} groupby into {out} by {method:?}");
            }
            let small = bag::from_sequence(ints(&xs[..xs.len().min(5)]), 2).unwrap();
            let prod = small.product(&b.map("t-neg").unwrap());
            assert_eq!(prod.npartitions(), small.npartitions() * b.npartitions());
            let prod = prod.compute(s).unwrap();
            let mut want = Vec::new();
            // The product's items, as a multiset.
            for &a in &xs[..xs.len().min(5)] {
                for &c in &xs {
                    want.push(Item::pair(a, -c));
                }
            }
            let mut got = prod;
            got.sort();
            want.sort();
            assert_eq!(got, want, "{name} product");
            // Steps and a reduction over a product read the pairs as they are made.
            let firsts = &xs[..xs.len().min(5)];
            let bigger: i64 = firsts.iter()
                .flat_map(|&a| xs.iter().filter(move |&&c| a > c))
                .sum();
            let r = small.product(&b).filter("t-first-bigger").unwrap().pluck(1).sum();
            assert_eq!(r.compute(s).unwrap(), Item::Int(bigger), "{name} product, filter, sum");
            let g = small.product(&b).groupby("t-first-bigger-key", Some(2)).unwrap();
            let mut sizes: Vec<(Item, usize)> = g.compute(s).unwrap().iter()
                .map(|p| (p.at(0).unwrap().clone(), p.at(1).unwrap().as_list().unwrap().len()))
                .collect();
            sizes.sort();
            let n_bigger = firsts.iter().map(|&a| xs.iter().filter(|&&c| a > c).count()).sum::<usize>();
            let mut want_sizes = vec![(Item::Bool(false), firsts.len() * xs.len() - n_bigger),
                (Item::Bool(true), n_bigger)];
            want_sizes.retain(|w| w.1 > 0);
            assert_eq!(sizes, want_sizes, "{name} product, groupby");
            assert_eq!(b.take(k * 3, s).unwrap(), ints(&xs[..(k * 3).min(xs.len())]), "{name}");
            let rev = b.map_partitions("t-reverse").unwrap().map("t-neg").unwrap();
            assert_eq!(rev.count().compute(s).unwrap(), Item::Int(xs.len() as i64), "{name}");
        });
    }
}

#[test]
fn a_bag_is_a_graph_any_scheduler_computes() {
    register();
    let b = bag::range(20, 4).unwrap().filter("t-even").unwrap();
    let (g, keys) = b.to_graph();
    assert_eq!(keys.len(), 4);
    let parts = dask_graph::Inline.get(g, &keys).unwrap();
    assert_eq!(parts.len(), 4);
    // `str.split` then `flatten` runs fused; with a step between, as two steps: the same.
    let words = bag::from_sequence([Item::from("a b"), Item::from(" c\td ")], 2).unwrap();
    let fused = words.map(bag::STR_SPLIT).unwrap().flatten();
    let apart = words
        .map(bag::STR_SPLIT)
        .unwrap()
        .map(bag::IDENTITY)
        .unwrap()
        .flatten();
    let want = ["a", "b", "c", "d"].map(Item::from).to_vec();
    assert_eq!(fused.compute(&dask_graph::Inline).unwrap(), want);
    assert_eq!(apart.compute(&dask_graph::Inline).unwrap(), want);
    let e = bag::range(2, 1)
        .unwrap()
        .map(bag::STR_SPLIT)
        .unwrap()
        .flatten();
    let e = e.compute(&dask_graph::Inline).unwrap_err().to_string();
    assert!(e.contains("str.split: a int item is not a string"), "{e}");
}

#[test]
fn refused_and_failing_functions_name_what_went_wrong() {
    register();
    let b = bag::range(10, 3).unwrap();
    assert!(matches!(
        b.map("t-no-such"),
        Err(BagError::UnknownFunction { ref name, expected: bag::Kind::Map }) if name == "t-no-such"
    ));
    assert!(matches!(
        b.filter("t-neg"),
        Err(BagError::WrongKind {
            expected: bag::Kind::Predicate,
            registered: bag::Kind::Map,
            ..
        })
    ));
    assert!(matches!(
        b.groupby("t-even", None),
        Err(BagError::WrongKind { .. })
    ));
    assert!(matches!(
        bag::range(3, 0),
        Err(BagError::NoPartitions { .. })
    ));
    each(|name, s| {
        let msg = |r: Result<Vec<Item>, BagError>| r.unwrap_err().to_string();
        let e = msg(b.map("t-fails").unwrap().compute(s));
        assert!(e.contains("failed: refused "), "{name}: {e}");
        assert!(
            msg(b.map("t-panics").unwrap().compute(s)).contains("t-panics went off"),
            "{name}"
        );
        let e = msg(b.flatten().compute(s));
        assert!(
            e.contains("flatten: a int item is not a list"),
            "{name}: {e}"
        );
        assert!(msg(b.pluck("x").compute(s)).contains("not a map"), "{name}");
        let words = bag::from_sequence(["a", "b"].map(Item::from), 1).unwrap();
        let e = words.sum().compute(s).unwrap_err().to_string();
        assert!(e.contains("cannot add a int and a str"), "{name}: {e}");
        assert_eq!(
            words.pluck_or("x", Item::Null).compute(s).unwrap(),
            vec![Item::Null; 2]
        );
        let e = bag::from_sequence([Item::Int(i64::MAX), Item::Int(1)], 2)
            .unwrap()
            .sum()
            .compute(s);
        assert!(
            e.unwrap_err().to_string().contains("integer overflow"),
            "{name}"
        );
        let pairs = bag::from_sequence([Item::pair(1, 2)], 1).unwrap();
        let e = msg(pairs.pluck(5).compute(s));
        assert!(
            e.contains("pluck [5]: out of range for a list of 2"),
            "{name}: {e}"
        );
        assert_eq!(b.topk(usize::MAX).compute(s).unwrap().len(), 10, "{name}");
        let empty = bag::from_sequence([], 3).unwrap();
        assert_eq!(empty.npartitions(), 1);
        assert!(
            matches!(empty.max().compute(s), Err(BagError::Empty { ref op, .. }) if op == "max")
        );
        assert_eq!(empty.count().compute(s).unwrap(), Item::Int(0));
        assert_eq!(empty.frequencies(true).compute(s).unwrap(), vec![]);
    });
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("bag-props-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Any block size splits the files at line boundaries: every line exactly once, in order.
    #[test]
    fn text_blocks_keep_every_line(
        files in prop::collection::vec(prop::collection::vec("[a-zé ]{0,12}", 0..12), 1..4),
        blocksize in 1u64..40,
        crlf in any::<bool>(),
        last_newline in any::<bool>(),
    ) {
        register();
        let dir = tmp("blocks");
        let mut want = Vec::new();
        for (i, lines) in files.iter().enumerate() {
            let end = if crlf { "\r\n" } else { "\n" };
            let mut text = lines.join(end);
            if last_newline && !lines.is_empty() {
                text.push_str(end);
            }
            // A file's lines as a reader sees them (no final empty line).
            want.extend(text.lines().map(Item::from));
            std::fs::write(dir.join(format!("f{i}.txt")), text).unwrap();
        }
        let pattern = format!("{}/*.txt", dir.display());
        let whole = bag::read_text(&pattern, None).unwrap();
        prop_assert_eq!(whole.npartitions(), files.len());
        let blocks = bag::read_text(&pattern, Some(blocksize)).unwrap();
        for (name, s) in schedulers() {
            prop_assert_eq!(&whole.compute(s.as_ref()).unwrap(), &want, "{}", name);
            prop_assert_eq!(&blocks.compute(s.as_ref()).unwrap(), &want, "{} blocks of {}", name, blocksize);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn text_and_json_files_round_trip_and_fail_clearly() {
    register();
    let dir = tmp("files");
    let recs: Vec<Item> = (0..50)
        .map(|i| Item::map([("x", Item::Float(i as f64 / 50.0)), ("y", Item::Int(i))]))
        .collect();
    let b = bag::from_sequence(recs.clone(), 4).unwrap();
    each(|name, s| {
        let out = dir.join(name);
        let files = b
            .map(bag::JSON_DUMPS)
            .unwrap()
            .to_textfiles(&format!("{}/*.jsonl.gz", out.display()), s)
            .unwrap();
        assert_eq!(files.len(), 4);
        let back = bag::read_json(&format!("{}/*.jsonl.gz", out.display()), None).unwrap();
        assert_eq!(back.compute(s).unwrap(), recs, "{name}");
        bag::register_predicate("t-x-gt-half", |r: &Item| {
            r.get("x").and_then(Item::as_f64).is_some_and(|x| x > 0.5)
        });
        let y = back
            .filter("t-x-gt-half")
            .unwrap()
            .pluck("y")
            .sum()
            .compute(s)
            .unwrap();
        assert_eq!(y, Item::Int((26..50).sum()), "{name}");
    });
    std::fs::write(
        dir.join("blank.jsonl"),
        "{\"a\": 1}\n  \n\n\t\n{\"a\": 2}\n",
    )
    .unwrap();
    let blank = bag::read_json(&format!("{}/blank.jsonl", dir.display()), None).unwrap();
    let a = blank.pluck("a").compute(&dask_graph::Inline).unwrap();
    assert_eq!(a, vec![Item::Int(1), Item::Int(2)]);
    std::fs::write(dir.join("bad.txt"), b"ok\n\xff\xfe\n").unwrap();
    let bad = bag::read_text(&format!("{}/bad.txt", dir.display()), None).unwrap();
    let e = bad.compute(&dask_graph::Inline).unwrap_err().to_string();
    assert!(e.contains("not UTF-8"), "{e}");
    assert!(matches!(
        bag::read_text(&format!("{}/nothing-*.txt", dir.display()), None),
        Err(BagError::NoFiles { .. })
    ));
    assert!(matches!(
        bag::read_text("[", None),
        Err(BagError::Pattern { .. })
    ));
    let r = bag::range(3, 1)
        .unwrap()
        .to_textfiles("no-star.txt", &dask_graph::Inline);
    assert!(matches!(r, Err(BagError::Pattern { .. })));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn word_count_matches_a_plain_counter() {
    register();
    let text = "the cat sat on the mat\nthe dog\n\nA cat, a dog";
    let lines: Vec<Item> = text.lines().map(Item::from).collect();
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for w in text.split_whitespace() {
        *counts.entry(w).or_default() += 1;
    }
    let mut want: Vec<(&str, i64)> = counts.into_iter().collect();
    want.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let want: Vec<Item> = want
        .iter()
        .take(3)
        .map(|&(w, c)| Item::pair(w, c))
        .collect();
    bag::register_map("t-second", |p: &Item| p.at(1).cloned().unwrap_or_default());
    let b: Bag = bag::from_sequence(lines, 3).unwrap();
    each(|name, s| {
        let f = b.map(bag::STR_SPLIT).unwrap().flatten().frequencies(true);
        assert_eq!(f.take(3, s).unwrap(), want, "{name}");
        let top = f.topk_by(1, "t-second").unwrap().compute(s).unwrap();
        assert_eq!(top, vec![Item::pair("the", 3)], "{name}");
    });
}
