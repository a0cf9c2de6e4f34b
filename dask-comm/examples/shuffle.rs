//! A peer-to-peer shuffle of bytes alone between two worker processes, over `tcp://` and
//! `ucx://`: the rate at which the workers deliver pieces to each other (from their transfer
//! logs), against which `ucx_perftest -t tag_bw` between two processes is the reference.
//!
//! ```text
//! cargo run --release -p dask-comm --example shuffle [-- --protocol tcp|ucx] [--size BYTES] [--rounds N]
//! ```
//!
//! Each round shuffles 8 inputs × 8 outputs of `--size` bytes (default 4 MiB: 256 MiB in
//! all, half of it crossing between the workers), checks every byte, and prints one JSON
//! line.

use dask_comm::{drills, ClusterOptions, LocalCluster, Protocol};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    drills::register();
    dask_comm::run_if_worker();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let protocols = match flag("--protocol").as_deref() {
        None => vec![Protocol::Tcp, Protocol::Ucx],
        Some("tcp") => vec![Protocol::Tcp],
        Some("ucx") => vec![Protocol::Ucx],
        Some(other) => return Err(format!("--protocol tcp or ucx, not {other:?}").into()),
    };
    let size: i64 = flag("--size").map_or(Ok(4 << 20), |s| s.parse())?;
    let rounds: usize = flag("--rounds").map_or(Ok(3), |r| r.parse())?;
    for protocol in protocols {
        let cluster = LocalCluster::with(ClusterOptions {
            workers: 2,
            threads_per_worker: 1,
            protocol,
            ..Default::default()
        })?;
        let client = cluster.client()?;
        client.set_progress(true);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while client.workers().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // One round to open the connections.
        drills::shuffle_throughput(&client, 2, 2, 1024, 1)?;
        for r in drills::shuffle_throughput(&client, 8, 8, size, rounds)? {
            let pairs: Vec<String> = r.pairs.iter().map(|p| p.to_json()).collect();
            println!(
                "{{\"protocol\":\"{protocol:?}\",\"size\":{size},\"seconds\":{:.6},\"moved_mb\":{:.3},\"deliveries\":{},\"pair_mb_s\":{:.1},\"pairs\":[{}]}}",
                r.seconds,
                r.moved as f64 / 1e6,
                r.deliveries,
                r.pair_mb_s,
                pairs.join(",")
            );
        }
    }
    Ok(())
}
