//! Batches of tagged messages (`send_batch`, `recv_batch`): order across eager and rendezvous
//! sizes, buffers kept while UCX owns them, cancellation, and the peer's close.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use futures::FutureExt;
use ucx::{Error, ProgressMode};

const SIZES: [usize; 6] = [8, 100, 40_000, 1 << 20, 0, 8];

async fn order_across_sizes(mode: ProgressMode) {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, mode).await;
    for round in 0..3u8 {
        let msgs: Vec<Vec<u8>> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| pattern(n, round * 16 + i as u8))
            .collect();
        let bufs: Vec<Vec<u8>> = SIZES.iter().map(|_| Vec::with_capacity(1 << 20)).collect();
        let ((sent, back), (got, bufs)) = within("batch", async {
            tokio::join!(client.send_batch(msgs, 9), server.recv_batch(bufs, 9))
        })
        .await;
        sent.unwrap();
        assert_eq!(got.unwrap(), SIZES.len(), "{mode:?}");
        assert_eq!(
            bufs, back,
            "{mode:?}: round {round} came back out of order or wrong"
        );
    }
    // What follows a batch on the same tag comes after it.
    let (sent, got) = within("after", async {
        tokio::join!(
            async {
                let (r, _) = client.send_batch(vec![vec![1u8; 8], vec![2u8; 8]], 9).await;
                r.unwrap();
                client.send(vec![3u8; 8], 9).await
            },
            server.recv_batch((0..3).map(|_| Vec::with_capacity(8)).collect::<Vec<_>>(), 9)
        )
    })
    .await;
    sent.0.unwrap();
    assert_eq!(got.0.unwrap(), 3);
    assert_eq!(got.1, vec![vec![1u8; 8], vec![2u8; 8], vec![3u8; 8]]);
    // Empty batches are fine.
    assert!(client.send_batch(Vec::<Vec<u8>>::new(), 9).await.0.is_ok());
    assert_eq!(
        server.recv_batch(Vec::<Vec<u8>>::new(), 9).await.0.unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_across_sizes_polling() {
    order_across_sizes(ProgressMode::Polling).await;
}

#[tokio::test(flavor = "current_thread")]
async fn order_across_sizes_blocking() {
    order_across_sizes(ProgressMode::Blocking).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_across_sizes_thread() {
    order_across_sizes(ProgressMode::Thread).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_batch_receive_is_cancelled_and_keeps_its_buffers() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let mut views = Vec::new();
    let mut flags = Vec::new();
    let mut bufs = Vec::new();
    for _ in 0..4 {
        let (buf, view, dropped) = Canary::new(vec![0u8; 64 << 10]);
        bufs.push(buf);
        views.push(view);
        flags.push(dropped);
    }
    // Poll once (posts every receive), then drop the batch mid-flight: the buffers are parked
    // until UCX has cancelled every receive.
    assert!(server.recv_batch(bufs, 4).now_or_never().is_none());
    within("parked buffers released", async {
        while !flags.iter().all(|f| f.load(Ordering::SeqCst)) {
            server.worker().progress();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    // Messages sent to the tag afterwards reach new receives, not the dropped buffers.
    for (i, n) in [100usize, 40_000].into_iter().enumerate() {
        let data = pattern(n, i as u8);
        let (sent, got) = within("resend", async {
            tokio::join!(client.send(data.clone(), 4), server.recv_vec(4))
        })
        .await;
        sent.0.unwrap();
        assert_eq!(got.unwrap(), data);
    }
    assert!(views.iter().all(|v| v.iter().all(|&b| b == CANARY)));
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_send_batch_keeps_its_buffers_until_ucx_is_done() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    // 8 MiB goes by rendezvous: UCX reads the sender's memory only once the receiver is there.
    let data: Vec<Vec<u8>> = (0..2).map(|i| pattern(8 << 20, i)).collect();
    let (mut bufs, mut flags) = (Vec::new(), Vec::new());
    for d in &data {
        let (buf, _view, dropped) = Canary::new(d.clone());
        bufs.push(buf);
        flags.push(dropped);
    }
    assert!(client.send_batch(bufs, 5).now_or_never().is_none());
    assert!(flags.iter().all(|f| !f.load(Ordering::SeqCst)));
    for d in &data {
        let got = within("receive", server.recv_vec(5)).await.unwrap();
        assert!(got == *d, "receiver saw freed (canary) memory");
    }
    within("parked send buffers released", async {
        while !flags.iter().all(|f| f.load(Ordering::SeqCst)) {
            client.worker().progress();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_receive_reports_truncation_and_keeps_the_rest() {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, ProgressMode::Blocking).await;
    let msgs = vec![vec![1u8; 8], vec![2u8; 64], vec![3u8; 8]];
    let bufs = vec![
        Vec::with_capacity(8),
        Vec::with_capacity(16),
        Vec::with_capacity(8),
    ];
    let ((sent, _), (got, bufs)) = within("batch", async {
        tokio::join!(client.send_batch(msgs, 6), server.recv_batch(bufs, 6))
    })
    .await;
    sent.unwrap();
    assert!(
        matches!(got, Err(Error::Truncated { message: 64, .. })),
        "{got:?}"
    );
    assert_eq!(bufs[0], vec![1u8; 8]);
    assert_eq!(
        bufs[2],
        vec![3u8; 8],
        "the receive after a truncated one still lands"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_receive_ends_when_the_peer_closes_after_delivering_what_it_sent() {
    for mode in MODES {
        let ctx = context();
        let (server, client, _sw, _cw) = pair(&ctx, mode).await;
        let bufs: Vec<Vec<u8>> = (0..4).map(|_| Vec::with_capacity(8)).collect();
        let (closed, (got, bufs)) = within("send, close and receive", async {
            tokio::join!(
                async {
                    let (sent, _) = client.send_batch(vec![vec![7u8; 8], vec![8u8; 8]], 3).await;
                    sent.unwrap();
                    client.close().await
                },
                server.recv_batch(bufs, 3)
            )
        })
        .await;
        closed.unwrap();
        let e = got.expect_err("the peer closed before the last two");
        assert!(e.is_disconnect(), "{mode:?}: {e}");
        assert_eq!(bufs[0], vec![7u8; 8], "{mode:?}");
        assert_eq!(bufs[1], vec![8u8; 8], "{mode:?}");
    }
}

async fn arrived(mode: ProgressMode) {
    let ctx = context();
    let (server, client, _sw, _cw) = pair(&ctx, mode).await;
    // Nothing has arrived: an empty list, at once.
    assert!(within("empty", server.recv_arrived(2, 8, 64))
        .await
        .unwrap()
        .is_empty());
    let sizes = [8usize, 0, 60, 1 << 20, 64, 8];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u8))
        .collect();
    let mut got: Vec<Vec<u8>> = Vec::new();
    // The send of the 1 MiB message (rendezvous) ends once it is received: both at once.
    let (sent, ()) = within("send and take what arrived", async {
        tokio::join!(client.send_batch(msgs.clone(), 2), async {
            while got.len() < sizes.len() {
                // At most 2 a call, up to 64 bytes each until the 1 MiB message is next, which
                // is then taken and waited for.
                let largest = if got.len() == 3 { 1 << 20 } else { 64 };
                server.worker().progress(); // polling mode: nothing else moves arrivals
                let more = server.recv_arrived(2, 2, largest).await.unwrap();
                assert!(more.len() <= 2, "{mode:?}: more than asked for");
                got.extend(more);
                tokio::task::yield_now().await;
            }
        })
    })
    .await;
    sent.0.unwrap();
    assert_eq!(got, msgs, "{mode:?}: out of order or wrong");
    // A message longer than `largest` stays for a later receive.
    let (sent, _) = within(
        "send",
        client.send_batch(vec![pattern(100, 1), pattern(8, 2)], 2),
    )
    .await;
    sent.unwrap();
    within("left alone", async {
        for _ in 0..50 {
            assert!(
                server.recv_arrived(2, 8, 64).await.unwrap().is_empty(),
                "{mode:?}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(
        within("recv", server.recv_vec(2)).await.unwrap(),
        pattern(100, 1)
    );
    let mut last = Vec::new();
    within("the rest", async {
        while last.is_empty() {
            server.worker().progress();
            last = server.recv_arrived(2, 8, 64).await.unwrap();
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(last, vec![pattern(8, 2)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrived_messages_polling() {
    arrived(ProgressMode::Polling).await;
}

#[tokio::test(flavor = "current_thread")]
async fn arrived_messages_blocking() {
    arrived(ProgressMode::Blocking).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrived_messages_thread() {
    arrived(ProgressMode::Thread).await;
}
