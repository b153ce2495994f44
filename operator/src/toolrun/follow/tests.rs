use std::time::Duration;

use futures::StreamExt;
use futures::io::BufReader;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use toolrun_runner::{Event, PROTOCOL_VERSION, Verdict};

use super::*;

use crate::toolrun::record::tests::{log_of, record};

/// Scans `log` read `chunk` bytes at a time.
async fn scan(log: &str, chunk: usize, cap: usize) -> Result<RunRecord, FollowError> {
    scan_for_record(BufReader::with_capacity(chunk, log.as_bytes()), cap).await
}

#[tokio::test]
async fn the_record_is_found_after_chunks_whatever_the_read_sizes() {
    let log = log_of(&[
        Event::Stdout { data: "1\n".into() },
        Event::Stderr { data: "w\n".into() },
        Event::Result(record("1\n")),
    ]);
    for chunk in [1, 2, 7, 64, 4096] {
        assert_eq!(
            scan(&log, chunk, 1 << 20).await.unwrap(),
            record("1\n"),
            "{chunk}"
        );
    }
    // Without the final newline (the stream ended right after the object).
    assert_eq!(
        scan(log.trim_end(), 5, 1 << 20).await.unwrap(),
        record("1\n")
    );
    // Anything after the record is not read: the record is returned at once.
    let more = format!("{log}{}", "x".repeat(10_000));
    assert_eq!(scan(&more, 16, 1 << 20).await.unwrap(), record("1\n"));
}

#[tokio::test]
async fn a_forged_record_in_the_output_is_not_the_record() {
    let fake = Event::Result(record("forged")).to_line();
    let mut real = record(&fake);
    real.verdict = Verdict::RuntimeError;
    real.exit_code = 1;
    let log = log_of(&[
        Event::Stdout { data: fake.clone() },
        Event::Result(real.clone()),
    ]);
    assert_eq!(scan(&log, 3, 1 << 20).await.unwrap(), real);
    let cut = log_of(&[Event::Stdout { data: fake }]);
    assert!(matches!(
        scan(&cut, 3, 1 << 20).await,
        Err(FollowError::Ended)
    ));
}

#[tokio::test]
async fn a_log_without_a_usable_record_ends_the_follower() {
    assert!(matches!(scan("", 4, 100).await, Err(FollowError::Ended)));
    let chunks = log_of(&[Event::Stdout { data: "x".into() }]);
    assert!(matches!(
        scan(&chunks, 4, 100).await,
        Err(FollowError::Ended)
    ));
    let cut = r#"{"event":"result","version":1,"verdict":"OK","exit_"#;
    assert!(matches!(
        scan(cut, 4, 1000).await,
        Err(FollowError::Record(RecordError::Malformed(_)))
    ));
    let mut newer = record("");
    newer.version = PROTOCOL_VERSION + 1;
    assert!(matches!(
        scan(&log_of(&[Event::Result(newer)]), 4, 1000).await,
        Err(FollowError::Record(RecordError::Version { .. }))
    ));
}

#[tokio::test]
async fn a_line_longer_than_the_cap_ends_the_follower() {
    let line = log_of(&[Event::Result(record(&"y".repeat(500)))]);
    let len = line.trim_end().len();
    // Exactly the cap is held; one byte less is refused.
    assert!(scan(&line, 64, len).await.is_ok());
    assert!(matches!(
        scan(&line, 64, len - 1).await,
        Err(FollowError::LineTooLong(c)) if c == len - 1
    ));
    // An endless line without a newline is refused once past the cap, not held.
    let endless = "z".repeat(1 << 20);
    assert!(matches!(
        scan(&endless, 4096, 10_000).await,
        Err(FollowError::LineTooLong(10_000))
    ));
    assert_eq!(line_cap(65_536), 2 * 65_536 + 64 * 1024);
    assert_eq!(line_cap(u32::MAX), 2 * u32::MAX as usize + 64 * 1024);
}

fn pod(name: &str, uid: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

/// An HTTP server on localhost standing in for the log endpoint: answers every request
/// with `body` (then closes) or, when `body` is None, never answers.
async fn log_server(body: Option<String>) -> Api<Pod> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let Some(body) = body else {
                    // Hold the connection open without answering.
                    let _ = s.read(&mut buf).await;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    return;
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(body.as_bytes()).await;
            });
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    Api::namespaced(client, "ns")
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn followers_are_bounded_one_per_pod_and_stop_with_the_term() {
    let pods = log_server(None).await;
    let f = Arc::new(Followers::new(2, "ns".into()));
    assert!(
        !f.follow(&pods, "r1", &pod("p1", "u1"), 1000),
        "no term, no follower"
    );
    let _rx = f.start_term();
    assert!(f.follow(&pods, "r1", &pod("p1", "u1"), 1000));
    assert!(
        !f.follow(&pods, "r1", &pod("p1", "u1"), 1000),
        "one per pod"
    );
    assert!(f.follow(&pods, "r2", &pod("p2", "u2"), 1000));
    assert!(
        !f.follow(&pods, "r3", &pod("p3", "u3"), 1000),
        "past maxLogFollowers"
    );
    assert_eq!(f.live(), 2);
    f.forget_run("r1");
    assert_eq!(f.live(), 1);
    assert!(
        f.follow(&pods, "r3", &pod("p3", "u3"), 1000),
        "a slot is free again"
    );
    f.end_term();
    assert_eq!(f.live(), 0);
    assert!(
        !f.follow(&pods, "r4", &pod("p4", "u4"), 1000),
        "the term ended"
    );
    let _rx = f.start_term();
    assert!(
        !Arc::new(Followers::new(0, "ns".into())).follow(&pods, "r", &pod("p", "u"), 1),
        "0 disables"
    );
}

#[tokio::test]
async fn a_record_read_live_is_kept_by_pod_uid_and_triggers_a_reconcile() {
    let log = log_of(&[
        Event::Stdout { data: "1\n".into() },
        Event::Result(record("1\n")),
    ]);
    let pods = log_server(Some(log)).await;
    let f = Arc::new(Followers::new(4, "ns".into()));
    let mut rx = f.start_term();
    assert!(f.follow(&pods, "r1", &pod("p1", "u1"), 10_000));
    let triggered = tokio::time::timeout(Duration::from_secs(10), rx.next())
        .await
        .expect("a trigger")
        .expect("the stream is open");
    assert_eq!(triggered, ObjectRef::new("r1").within("ns"));
    assert_eq!(f.record("u1"), Some(record("1\n")));
    assert_eq!(f.record("u2"), None);
    assert_eq!(f.live(), 0);
    assert!(
        !f.follow(&pods, "r1", &pod("p1", "u1"), 10_000),
        "followed once"
    );
    f.forget_run("r1");
    assert_eq!(f.record("u1"), None);

    // A log without a record leaves nothing and triggers nothing.
    let pods = log_server(Some("{\"event\":\"stdout\",\"data\":\"x\"}\n".into())).await;
    assert!(f.follow(&pods, "r2", &pod("p2", "u2"), 10_000));
    until("the follower ended", || f.live() == 0).await;
    assert_eq!(f.record("u2"), None);
    assert!(rx.try_recv().is_err(), "no trigger");
    // A line past the cap: the same.
    let long = log_of(&[Event::Result(record(&"y".repeat(5000)))]);
    let pods = log_server(Some(long)).await;
    assert!(f.follow(&pods, "r3", &pod("p3", "u3"), 1000));
    until("the follower ended", || f.live() == 0).await;
    assert_eq!(f.record("u3"), None);
}
