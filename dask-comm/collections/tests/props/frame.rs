//! The dataframe against the same computation on one polars `DataFrame`: random rows and
//! partitionings, every operation, on the `Inline` and `Threaded` schedulers and on an
//! in-process `LocalCluster` (partitions cross the workers as Arrow IPC, as between
//! processes).

use crate::common::{cluster, schedulers};
use dask_collections::dataframe::{self, Agg, DataFrameError, How, ShuffleMethod, col, lit};
use dask_graph::Scheduler;
use polars::prelude::*;
use proptest::prelude::*;

fn each(mut f: impl FnMut(&str, &dyn Scheduler)) {
    dataframe::register();
    for (name, s) in schedulers() {
        f(name, s.as_ref());
    }
    f("cluster", cluster());
}

/// `df` with its rows in a fixed order (by every column), chunks joined.
fn sorted(df: &DataFrame) -> DataFrame {
    let cols: Vec<String> = df
        .get_column_names()
        .iter()
        .map(|c| c.to_string())
        .collect();
    let mut d = df
        .sort(cols, SortMultipleOptions::default().with_nulls_last(true))
        .unwrap();
    d.rechunk_mut();
    d
}

/// The same rows (in any order), floats within 1e-9 relative.
fn same(got: &DataFrame, want: &DataFrame, what: &str) {
    let (g, w) = (sorted(got), sorted(want));
    assert_eq!(
        g.get_column_names(),
        w.get_column_names(),
        "{what}: columns"
    );
    assert_eq!(g.height(), w.height(), "{what}: rows\ngot {g}\nwant {w}");
    for (a, b) in g.columns().iter().zip(w.columns()) {
        let (a, b) = (a.as_materialized_series(), b.as_materialized_series());
        if a.dtype().is_float() {
            let (a, b) = (a.f64().unwrap(), b.cast(&DataType::Float64).unwrap());
            for (x, y) in a.iter().zip(b.f64().unwrap().iter()) {
                let ok = match (x, y) {
                    (Some(x), Some(y)) => {
                        (x - y).abs() <= 1e-9 * y.abs().max(1.0) || (x.is_nan() && y.is_nan())
                    }
                    // A group of one row: pandas' standard deviation is NaN, polars' null.
                    (None, None) => true,
                    (Some(x), None) | (None, Some(x)) => x.is_nan(),
                };
                assert!(
                    ok,
                    "{what}: column {}: {x:?} vs {y:?}\ngot {g}\nwant {w}",
                    a.name()
                );
            }
        } else {
            assert!(
                a.equals_missing(b),
                "{what}: column {}\ngot {g}\nwant {w}",
                a.name()
            );
        }
    }
}

fn frame(rows: &[(i64, u8, f64)]) -> DataFrame {
    let names = ["a", "b", "c"];
    df!(
        "k" => rows.iter().map(|r| r.0).collect::<Vec<_>>(),
        "s" => rows.iter().map(|r| names[r.1 as usize % 3]).collect::<Vec<_>>(),
        "v" => rows.iter().map(|r| r.2).collect::<Vec<_>>(),
    )
    .unwrap()
}

fn rows() -> impl Strategy<Value = (Vec<(i64, u8, f64)>, usize)> {
    (
        prop::collection::vec((0i64..6, 0u8..3, -10.0f64..10.0), 1..40),
        1usize..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn row_operations_and_aggregations((data, n) in rows()) {
        let whole = frame(&data);
        let d = dataframe::from_polars(whole.clone(), n).unwrap();
        let lf = || whole.clone().lazy();
        let filtered = d.filter(col("v").gt(lit(0.0)).and(col("s").is_in(["a", "b"]))).unwrap()
            .assign("w", col("v") * lit(2.0) + col("k")).unwrap()
            .select(&["k", "w"]).unwrap();
        let want_filtered = lf()
            .filter(polars::prelude::col("v").gt(polars::prelude::lit(0.0))
                .and(polars::prelude::col("s").eq(polars::prelude::lit("a"))
                    .or(polars::prelude::col("s").eq(polars::prelude::lit("b")))))
            .with_column((polars::prelude::col("v") * polars::prelude::lit(2.0)
                + polars::prelude::col("k")).alias("w"))
            .select([polars::prelude::col("k"), polars::prelude::col("w")])
            .collect().unwrap();
        prop_assert_eq!(filtered.columns(), vec!["k".to_string(), "w".to_string()]);
        let aggs = [("v", Agg::Sum), ("v", Agg::Mean), ("v", Agg::Count), ("v", Agg::Min),
                    ("v", Agg::Max), ("v", Agg::Std), ("k", Agg::Sum)];
        let grouped = d.groupby(&["s", "k"]).unwrap().agg(&aggs).unwrap();
        let pc = polars::prelude::col;
        let want_grouped = lf().group_by([pc("s"), pc("k")]).agg([
            pc("v").sum().alias("v_sum"), pc("v").mean().alias("v_mean"),
            pc("v").count().cast(DataType::UInt64).alias("v_count"), pc("v").min().alias("v_min"),
            pc("v").max().alias("v_max"), pc("v").std(1).alias("v_std"),
            pc("k").sum().alias("k_sum"),
        ]).collect().unwrap();
        let counts = d.value_counts("s").unwrap();
        let want_counts = lf().group_by([pc("s")])
            .agg([len().cast(DataType::UInt64).alias("count")]).collect().unwrap();
        let distinct = d.drop_duplicates(Some(&["k", "s"])).unwrap();
        let want_distinct = lf().unique_stable_generic(Some(vec![pc("k"), pc("s")]),
            UniqueKeepStrategy::First).collect().unwrap();
        let described = d.describe().unwrap();
        // A reduction after pending operations that change the columns.
        let after_ops = filtered.groupby(&["k"]).unwrap().agg(&[("w", Agg::Sum), ("w", Agg::Var)]).unwrap();
        let want_after_ops = want_filtered.clone().lazy().group_by([pc("k")]).agg([
            pc("w").sum().alias("w_sum"), pc("w").var(1).alias("w_var"),
        ]).collect().unwrap();
        each(|name, s| {
            same(&filtered.compute(s).unwrap(), &want_filtered, &format!("{name} filter"));
            same(&grouped.compute(s).unwrap(), &want_grouped, &format!("{name} groupby"));
            same(&after_ops.compute(s).unwrap(), &want_after_ops, &format!("{name} ops, groupby"));
            let got_counts = counts.compute(s).unwrap();
            same(&got_counts, &want_counts, &format!("{name} value_counts"));
            let c = got_counts.column("count").unwrap().u64().unwrap().to_vec();
            assert!(c.windows(2).all(|w| w[0] >= w[1]), "{name}: counts largest first");
            // drop_duplicates keeps the first row of each pair, in row order.
            let got = distinct.compute(s).unwrap();
            assert!(got.equals_missing(&want_distinct), "{name} drop_duplicates\n{got}\n{want_distinct}");
            assert_eq!(d.nunique("k", s).unwrap(),
                whole.column("k").unwrap().n_unique().unwrap(), "{name} nunique");
            assert_eq!(d.len(s).unwrap(), whole.height(), "{name} len");
            assert!(d.head(3, s).unwrap().equals_missing(&whole.head(Some(3))), "{name} head");
            let desc = described.compute(s).unwrap();
            let v = desc.column("v").unwrap().f64().unwrap();
            let wv = whole.column("v").unwrap().as_materialized_series().clone();
            assert_eq!(v.get(0), Some(whole.height() as f64), "{name} describe count");
            let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1.0),
                (a, b) => a.is_none_or(f64::is_nan) && b.is_none_or(f64::is_nan),
            };
            assert!(close(v.get(1), wv.mean()), "{name} describe mean");
            assert!(close(v.get(2), wv.std(1)), "{name} describe std");
        });
    }

    #[test]
    fn sorts_by_any_column_in_order((data, n) in rows(), nulls in prop::collection::vec(any::<bool>(), 40)) {
        // Some keys null, one NaN, to see them placed as polars places them.
        let mut whole = frame(&data);
        let k: Vec<Option<i64>> = data.iter().zip(&nulls).map(|(r, &z)| (!z).then_some(r.0)).collect();
        let mut v: Vec<f64> = data.iter().map(|r| r.2).collect();
        v[0] = f64::NAN;
        whole.with_column(Series::new("k".into(), k).into()).unwrap();
        whole.with_column(Series::new("v".into(), v).into()).unwrap();
        let d = dataframe::from_polars(whole.clone(), n).unwrap();
        for by in ["k", "s", "v"] {
            let want = whole.sort([by], SortMultipleOptions::default().with_maintain_order(true)).unwrap();
            let sorted = d.sort_values(by).unwrap();
            prop_assert_eq!(sorted.npartitions(), d.npartitions());
            each(|name, s| {
                let got = sorted.compute(s).unwrap();
                assert!(got.equals_missing(&want), "{name} by {by}\ngot {got}\nwant {want}");
            });
        }
        // Descending and by several columns: each flag as polars takes it (nulls first, NaN
        // the largest), ties of the first column broken by the next.
        for (by, desc) in [(&["k"][..], &[true][..]), (&["s"], &[true]), (&["v"], &[true]),
                           (&["s", "k"], &[false, true]), (&["k", "v"], &[true, false]),
                           (&["s", "k", "v"], &[true])] {
            let flags = if desc.len() == 1 { vec![desc[0]; by.len()] } else { desc.to_vec() };
            let want = whole.sort(by.to_vec(), SortMultipleOptions::default()
                .with_order_descending_multi(flags).with_maintain_order(true)).unwrap();
            let sorted = d.sort_values_by(by, desc).unwrap();
            prop_assert_eq!(sorted.npartitions(), d.npartitions());
            each(|name, s| {
                let got = sorted.compute(s).unwrap();
                assert!(got.equals_missing(&want), "{name} by {by:?} {desc:?}\ngot {got}\nwant {want}");
            });
        }
        for (by, desc) in [(&[][..], &[true][..]), (&["k", "v"], &[true, false, true])] {
            let refused = d.sort_values_by(by, desc);
            assert!(matches!(refused, Err(DataFrameError::Invalid { .. })), "{refused:?}");
        }
        // No sortable value anywhere (every key null): one output takes every row.
        let mut none = whole.clone();
        none.with_column(Series::new("k".into(), vec![None::<i64>; whole.height()]).into()).unwrap();
        let got = dataframe::from_polars(none.clone(), n).unwrap().sort_values("k").unwrap();
        each(|name, s| {
            assert!(got.compute(s).unwrap().equals_missing(&none), "{name}: all keys null");
        });
        let refused = d.assign("l", lit(1i64)).unwrap().sort_values("nope");
        assert!(matches!(refused, Err(DataFrameError::NoColumn { .. })), "{refused:?}");
    }

    #[test]
    fn set_index_divisions_loc_and_merges_along_them(
        (data, n) in rows(),
        (right, nr) in rows(),
        nulls in prop::collection::vec(any::<bool>(), 40),
    ) {
        let mut whole = frame(&data);
        let k: Vec<Option<i64>> = data.iter().zip(&nulls).map(|(r, &z)| (!z).then_some(r.0 * 7 % 11)).collect();
        let mut v: Vec<f64> = data.iter().map(|r| r.2).collect();
        v[0] = f64::NAN;
        whole.with_column(Series::new("k".into(), k).into()).unwrap();
        whole.with_column(Series::new("v".into(), v).into()).unwrap();
        let d = dataframe::from_polars(whole.clone(), n).unwrap();
        let r = frame(&right).select(["k", "v"]).unwrap();
        let dr = dataframe::from_polars(r.clone(), nr).unwrap();
        let stable = SortMultipleOptions::default().with_maintain_order(true);
        each(|name, s| {
            use dataframe::Lit;
            let pl_lit = |l: &Lit| match l {
                Lit::Int(i) => polars::prelude::lit(*i),
                Lit::Float(f) => polars::prelude::lit(*f),
                Lit::Str(s) => polars::prelude::lit(s.clone()),
                Lit::Bool(b) => polars::prelude::lit(*b),
            };
            for (by, lo, hi) in [("k", Lit::Int(2), Lit::Int(6)),
                                 ("s", Lit::Str("b".into()), Lit::Str("c".into())),
                                 ("v", Lit::Float(-2.5), Lit::Float(4.0))] {
                let ix = d.set_index(by, s).unwrap();
                assert_eq!(ix.index(), Some(by));
                assert!(ix.npartitions() <= d.npartitions());
                let want = whole.sort([by], stable.clone()).unwrap();
                let got = ix.compute(s).unwrap();
                assert!(got.equals_missing(&want), "{name} set_index {by}\ngot {got}\nwant {want}");
                // Every partition within its divisions; the divisions increase.
                // No value but nulls and NaN: one partition, divisions unknown.
                let Some(div) = ix.divisions() else {
                    assert_eq!(ix.npartitions(), 1, "{name} {by}");
                    let got = ix.loc(lo.clone(), hi.clone()).unwrap().compute(s).unwrap();
                    assert_eq!(got.height(), 0, "{name} loc {by} of no value");
                    continue;
                };
                assert_eq!(div.len(), ix.npartitions() + 1, "{name} {by} {div}");
                let as_text = |s: &Series| -> Vec<Option<String>> {
                    s.cast(&DataType::String).unwrap().str().unwrap()
                        .iter().map(|v| v.map(str::to_string)).collect()
                };
                let as_f64 = |s: &Series| -> Vec<Option<f64>> {
                    s.cast(&DataType::Float64).unwrap().f64().unwrap().iter().collect()
                };
                let (g, keys) = ix.to_graph();
                let parts = s.get(g, &keys).unwrap();
                let last = ix.npartitions() - 1;
                for (i, p) in parts.iter().enumerate() {
                    let p = &p.downcast_ref::<dataframe::Frame>().unwrap().0;
                    let c = p.column(by).unwrap().as_materialized_series();
                    let within = |x: Option<std::cmp::Ordering>, y: Option<std::cmp::Ordering>| {
                        use std::cmp::Ordering::*;
                        x != Some(Less) && (y == Some(Less) || (i == last && y == Some(Equal)))
                    };
                    if by == "s" {
                        let (dv, cv) = (as_text(div), as_text(c));
                        for x in cv.iter().flatten() {
                            let (lo, hi) = (dv[i].as_ref().unwrap(), dv[i + 1].as_ref().unwrap());
                            assert!(within(Some(x.cmp(lo)), Some(x.cmp(hi))), "{name} {by} part {i}: {x} not in {div}");
                        }
                    } else {
                        let (dv, cv) = (as_f64(div), as_f64(c));
                        for x in cv.iter().flatten().filter(|x| !x.is_nan()) {
                            let (lo, hi) = (dv[i].unwrap(), dv[i + 1].unwrap());
                            assert!(within(x.partial_cmp(&lo), x.partial_cmp(&hi)), "{name} {by} part {i}: {x} not in {div}");
                        }
                        for w in dv.windows(2).take(ix.npartitions().saturating_sub(1)) {
                            assert!(w[0] < w[1], "{name} {by}: divisions {div}");
                        }
                    }
                }
                // loc: the rows in [lo, hi], in index order, from the partitions it touches.
                let range = ix.loc(lo.clone(), hi.clone()).unwrap();
                let want = whole.clone().lazy().filter(polars::prelude::col(by).gt_eq(pl_lit(&lo))
                        .and(polars::prelude::col(by).lt_eq(pl_lit(&hi))))
                    .collect().unwrap().sort([by], stable.clone()).unwrap();
                let got = range.compute(s).unwrap();
                assert!(got.equals_missing(&want), "{name} loc {by}\ngot {got}\nwant {want}");
                assert_eq!(range.divisions().unwrap().len(), range.npartitions() + 1);
            }
            // Merges on the index: sides with the same divisions join partition by partition
            // with no shuffle; another side is range-partitioned to the index's divisions.
            let ix = d.set_index("k", s).unwrap();
            let same_divisions = ix.filter(col("v").gt(lit(0.0))).unwrap().select(&["k", "v"]).unwrap();
            // Keys all null: no divisions on either side (one partition each).
            match (same_divisions.divisions(), ix.divisions()) {
                (Some(a), Some(b)) => assert!(a.equals(b), "{name}: {a} against {b}"),
                (None, None) => assert_eq!(ix.npartitions(), 1, "{name}"),
                (a, b) => panic!("{name}: divisions {a:?} against {b:?}"),
            }
            let rx = dr.set_index("k", s).unwrap();
            let pc = polars::prelude::col;
            for how in [How::Inner, How::Left, How::Outer] {
                let kind = match how { How::Inner => JoinType::Inner, How::Left => JoinType::Left,
                                       How::Outer => JoinType::Full };
                let pairs: [(&dataframe::DataFrame, &dataframe::DataFrame, DataFrame, DataFrame, bool); 4] = [
                    (&ix, &same_divisions, whole.clone(), whole.clone().lazy()
                        .filter(pc("v").gt(0.0)).select([pc("k"), pc("v")]).collect().unwrap(), true),
                    (&ix, &dr, whole.clone(), r.clone(), false),
                    (&d, &rx, whole.clone(), r.clone(), false),
                    (&ix, &rx, whole.clone(), r.clone(), false),
                ];
                for (i, (a, b, wa, wb, aligned)) in pairs.into_iter().enumerate() {
                    let want = wa.lazy().join(wb.lazy(), [pc("k")], [pc("k")],
                        JoinArgs::new(kind.clone()).with_coalesce(JoinCoalesce::CoalesceColumns)
                            .with_suffix(Some("_right".into()))).collect().unwrap();
                    let m = a.merge(b, &["k"], how).unwrap();
                    same(&m.compute(s).unwrap(), &want, &format!("{name} index merge {i} {how:?}"));
                    if aligned && a.npartitions() > 1 {
                        let (g, _) = m.to_graph();
                        assert!(!g.iter().any(|(k, _)| k.name().as_str().starts_with("merge") && k.name().as_str().contains("transfer")),
                                "{name}: equal divisions shuffled");
                        assert_eq!(m.index(), Some("k"));
                        assert!(m.divisions().is_some());
                    }
                }
            }
        });
        let refused = d.loc(1i64, 2i64);
        assert!(matches!(refused, Err(DataFrameError::NoIndex { op: "loc" })), "{refused:?}");
    }

    #[test]
    fn merges_broadcast_and_shuffled(
        (left, nl) in rows(),
        (right, nr) in rows(),
        how in prop::sample::select(vec![How::Inner, How::Left, How::Outer]),
    ) {
        let (l, r) = (frame(&left), frame(&right).select(["k", "v"]).unwrap());
        let pc = polars::prelude::col;
        let kind = match how { How::Inner => JoinType::Inner, How::Left => JoinType::Left,
                               How::Outer => JoinType::Full };
        let want = l.clone().lazy().join(r.clone().lazy(), [pc("k")], [pc("k")],
            JoinArgs::new(kind).with_coalesce(JoinCoalesce::CoalesceColumns)
                .with_suffix(Some("_right".into()))).collect().unwrap();
        for (nl, nr) in [(nl, nr), (nl, 1), (1, nr)] {
            let dl = dataframe::from_polars(l.clone(), nl).unwrap();
            let dr = dataframe::from_polars(r.clone(), nr).unwrap();
            for method in [ShuffleMethod::P2p, ShuffleMethod::Tasks] {
                let m = dl.merge_with(&dr, &["k"], how, method).unwrap();
                each(|name, s| {
                    same(&m.compute(s).unwrap(), &want,
                         &format!("{name} {how:?} {method:?} {nl}x{nr}"));
                });
            }
        }
    }
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("frame-props-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn files_round_trip_and_reads_push_down() {
    dataframe::register();
    let dir = tmp("files");
    let whole = frame(
        &(0..50)
            .map(|i| (i % 7, (i % 3) as u8, i as f64 / 4.0))
            .collect::<Vec<_>>(),
    );
    let d = dataframe::from_polars(whole.clone(), 4).unwrap();
    each(|name, s| {
        for ext in ["csv", "parquet"] {
            let out = dir.join(format!("{name}-{ext}"));
            let files = d
                .to_files(&format!("{}/part-*.{ext}", out.display()), s)
                .unwrap();
            assert_eq!(files.len(), 4);
            let pattern = format!("{}/part-*.{ext}", out.display());
            let back = if ext == "csv" {
                dataframe::read_csv(&pattern).unwrap()
            } else {
                dataframe::read_parquet(&pattern).unwrap()
            };
            assert_eq!(back.columns(), vec!["k", "s", "v"]);
            let got = back.compute(s).unwrap();
            assert!(got.equals_missing(&whole), "{name} {ext}\n{got}\n{whole}");
            let m = back
                .filter(col("k").eq(lit(3i64)))
                .unwrap()
                .groupby(&["s"])
                .unwrap()
                .mean("v")
                .unwrap()
                .compute(s)
                .unwrap();
            let want = whole
                .clone()
                .lazy()
                .filter(polars::prelude::col("k").eq(polars::prelude::lit(3i64)))
                .group_by([polars::prelude::col("s")])
                .agg([polars::prelude::col("v").mean().alias("v_mean")])
                .collect()
                .unwrap();
            same(&m, &want, &format!("{name} {ext} read, filter, mean"));
            // A read projected to what the query needs: a row count, a computed key.
            assert_eq!(
                back.select(&["v"]).unwrap().len(s).unwrap(),
                50,
                "{name} {ext} len"
            );
            let k2 = back
                .assign("k2", col("k") + lit(1i64))
                .unwrap()
                .groupby(&["k2"])
                .unwrap()
                .sum("v")
                .unwrap()
                .compute(s)
                .unwrap();
            let want = whole
                .clone()
                .lazy()
                .with_column((polars::prelude::col("k") + polars::prelude::lit(1i64)).alias("k2"))
                .group_by([polars::prelude::col("k2")])
                .agg([polars::prelude::col("v").sum().alias("v_sum")])
                .collect()
                .unwrap();
            same(&k2, &want, &format!("{name} {ext} assign, groupby"));
            // One column asked for twice is read once.
            let two = back
                .groupby(&["k"])
                .unwrap()
                .agg(&[("v", Agg::Sum), ("v", Agg::Mean)])
                .unwrap()
                .compute(s)
                .unwrap();
            let want = whole
                .clone()
                .lazy()
                .group_by([polars::prelude::col("k")])
                .agg([
                    polars::prelude::col("v").sum().alias("v_sum"),
                    polars::prelude::col("v").mean().alias("v_mean"),
                ])
                .collect()
                .unwrap();
            same(&two, &want, &format!("{name} {ext} a column twice"));
        }
    });
    std::fs::write(dir.join("bad-0.csv"), "k,v\n1,2.0\n").unwrap();
    std::fs::write(dir.join("bad-1.csv"), "k,v\nnot a number,2.0\n").unwrap();
    let bad = dataframe::read_csv(&format!("{}/bad-*.csv", dir.display())).unwrap();
    let e = bad.compute(&dask_graph::Inline).unwrap_err().to_string();
    assert!(e.contains("bad-1.csv"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn statistics_keep_their_digits_and_integers_do_not_wrap() {
    dataframe::register();
    // Large means: sums of squares would lose every digit of the variance.
    let big =
        df!("g" => [1i64, 1, 1, 2, 2], "x" => [1e9 + 1.0, 1e9 + 2.0, 1e9 + 3.0, 0.1, 0.1]).unwrap();
    // Int32 values whose sum does not fit an Int32.
    let wide = df!("g" => [1i64, 1], "i" => [2_000_000_000i32, 2_000_000_000]).unwrap();
    each(|name, s| {
        for n in [1, 2, 3] {
            let d = dataframe::from_polars(big.clone(), n).unwrap();
            let got = d
                .groupby(&["g"])
                .unwrap()
                .agg(&[("x", Agg::Var), ("x", Agg::Std)])
                .unwrap()
                .compute(s)
                .unwrap();
            let var = got.column("x_var").unwrap().f64().unwrap().to_vec();
            let std = got.column("x_std").unwrap().f64().unwrap().to_vec();
            assert!((var[0].unwrap() - 1.0).abs() < 1e-6, "{name} {n}: {var:?}");
            assert_eq!(var[1], Some(0.0), "{name} {n}: {var:?}");
            assert_eq!(std[1], Some(0.0), "{name} {n}: {std:?}");
            let d = dataframe::from_polars(wide.clone(), n).unwrap();
            let m = d
                .groupby(&["g"])
                .unwrap()
                .mean("i")
                .unwrap()
                .compute(s)
                .unwrap();
            assert_eq!(
                m.column("i_mean").unwrap().f64().unwrap().get(0),
                Some(2e9),
                "{name} {n}"
            );
        }
    });
}

#[test]
fn refusals_are_typed_and_name_what_is_wrong() {
    dataframe::register();
    let d = dataframe::from_polars(frame(&[(1, 0, 1.0), (2, 1, 2.0)]), 2).unwrap();
    assert!(matches!(
        d.filter(col("nope").gt(lit(1))),
        Err(DataFrameError::NoColumn { ref name, .. }) if name == "nope"
    ));
    assert!(matches!(
        d.groupby(&["x"]),
        Err(DataFrameError::NoColumn { .. })
    ));
    assert!(matches!(
        d.assign("w", col("s") * col("v")),
        Err(DataFrameError::Invalid { op: "assign", .. })
    ));
    assert!(matches!(
        d.map_partitions("no-such-fn"),
        Err(DataFrameError::UnknownFunction { .. })
    ));
    let other = dataframe::from_polars(df!("k" => ["1", "2"]).unwrap(), 1).unwrap();
    assert!(matches!(
        d.merge(&other, &["k"], How::Inner),
        Err(DataFrameError::KeyTypes { .. })
    ));
    assert!(matches!(
        dataframe::read_csv("/nonexistent-dir/*.csv"),
        Err(DataFrameError::Pattern { .. })
    ));
    assert!(matches!(
        dataframe::from_polars(frame(&[(1, 0, 1.0)]), 0),
        Err(DataFrameError::NoPartitions { .. })
    ));
    assert!(matches!(
        d.to_files("no-star.csv", &dask_graph::Inline),
        Err(DataFrameError::Pattern { .. })
    ));
}
