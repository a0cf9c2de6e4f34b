//! `ucx://` in blocking progress mode (the mode dask-comm uses), where the process's UCX
//! worker is progressed by a task on a runtime: a program that makes one runtime after
//! another (a test after a test, a cluster after a cluster) connects and talks in each.

mod common;

use transport::{Message, UcxIntent};

#[test]
fn ucx_connects_in_runtime_after_runtime() {
    transport::configure_ucx(UcxIntent {
        progress: ::ucx::ProgressMode::Blocking,
        ..Default::default()
    })
    .unwrap();
    for round in 0..3u32 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::time::timeout(common::STEP, async {
                let (server, client) = common::pair("ucx://127.0.0.1:0").await;
                client
                    .send(round, Message::from(vec![vec![round as u8; 10]]))
                    .await
                    .unwrap();
                let (ch, m) = server.recv().await.unwrap();
                assert_eq!((ch, m.len()), (round, 10));
                client.close().await.unwrap();
            })
            .await
            .unwrap_or_else(|_| panic!("round {round} in time"))
        });
    }
}
