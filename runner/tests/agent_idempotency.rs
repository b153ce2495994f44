//! Request ids: executed at most once, stored results re-sent, conflicts and expiry typed,
//! the results table bounded.

mod agent_support;

use std::time::Duration;

use agent_support::*;
use serde_json::json;
use toolrun_runner::agent::client::Tracker;
use toolrun_runner::agent::proto::{Body, FileOpKind as K, Op};
use toolrun_runner::{Language, Verdict};

/// A program that appends one line to a file: repeating its request after it finished returns
/// the stored record and the file still has one line.
#[test]
fn a_repeated_id_is_never_run_twice() {
    let ws = temp_dir("dup");
    let mut a = Agent::spawn(&[]);
    let s = spec(Language::Bash, "echo ran >> log; sleep 0.5; echo done", &ws);
    let first = a.call(&run_req("once", &s));
    let rec = record(&first);
    assert_eq!(rec.verdict, Verdict::Ok);
    // After completion: the stored final event, same seq, same record.
    let again = a.call(&run_req("once", &s));
    assert_eq!(again, first);
    assert_eq!(std::fs::read_to_string(ws.join("log")).unwrap(), "ran\n");
    assert_eq!(a.status("st")["requests_served"], 1);

    // In flight: the repeat replays what was sent and follows the live run; the client's
    // tracker drops the duplicates, and the program still runs once.
    let s2 = spec(
        Language::Bash,
        "echo ran >> log2; echo a; sleep 0.5; echo b",
        &ws,
    );
    a.send(&run_req("inflight", &s2));
    std::thread::sleep(Duration::from_millis(200));
    a.send(&run_req("inflight", &s2));
    let events = a.collect("inflight");
    let mut t = Tracker::new();
    let fresh: Vec<_> = events.iter().flat_map(|e| t.push(e.clone())).collect();
    let seqs: Vec<u64> = fresh.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{events:?}"
    );
    assert!(
        events.len() > fresh.len(),
        "the replay re-sent the first chunk: {events:?}"
    );
    assert_eq!(record(fresh.last().unwrap()).stdout, "a\nb\n");
    assert_eq!(std::fs::read_to_string(ws.join("log2")).unwrap(), "ran\n");
    assert_eq!(events.iter().filter(|e| e.body.is_final()).count(), 1);
}

#[test]
fn same_id_other_request_is_a_conflict() {
    let ws = temp_dir("conflict");
    let mut a = Agent::spawn(&["--workspace", ws.to_str().unwrap()]);
    ok(&a.call(&file_op(
        "w",
        K::WriteFile,
        json!({"path": "f", "content": "1"}),
    )));
    a.send(&file_op(
        "w",
        K::WriteFile,
        json!({"path": "f", "content": "2"}),
    ));
    let r = a.next();
    assert_eq!((r.seq, error(&r).0.as_str()), (0, "ID_CONFLICT"));
    assert_eq!(std::fs::read_to_string(ws.join("f")).unwrap(), "1");
}

#[test]
fn acknowledged_and_evicted_results_expire_and_never_rerun() {
    let ws = temp_dir("expire");
    let mut a = Agent::spawn(&["--workspace", ws.to_str().unwrap(), "--max-results", "2"]);
    let w = |i: u32| {
        file_op(
            &format!("w{i}"),
            K::WriteFile,
            json!({"path": format!("f{i}"), "content": "x"}),
        )
    };
    for i in 0..3 {
        ok(&a.call(&w(i)));
    }
    let s = a.status("s");
    assert_eq!(s["results_held"], 2);
    // w0 was evicted: refused, not run again (its file, removed meanwhile, stays gone).
    std::fs::remove_file(ws.join("f0")).unwrap();
    a.send(&w(0));
    let r = a.next();
    assert_eq!(
        (r.id.as_deref(), error(&r).0.as_str()),
        (Some("w0"), "RESULT_EXPIRED")
    );
    assert!(!ws.join("f0").exists());
    // w2 is held: re-sent.
    assert_eq!(ok(&a.call(&w(2)))["path"], "f2");
    // ack frees w1 and w2; repeats and resumes are then RESULT_EXPIRED.
    let ack = a.call(&req(
        "ack",
        Op::Ack {
            targets: vec!["w1".into(), "w2".into(), "zz".into()],
        },
    ));
    assert_eq!(ok(&ack)["forgotten"], 2);
    assert_eq!(a.status("s2")["results_held"], 0);
    std::fs::remove_file(ws.join("f1")).unwrap();
    a.send(&w(1));
    assert_eq!(error(&a.next()).0, "RESULT_EXPIRED");
    assert!(!ws.join("f1").exists());
    let r = a.call(&req(
        "res",
        Op::Resume {
            target: "w2".into(),
            after_seq: 0,
        },
    ));
    assert_eq!(error(&r).0, "RESULT_EXPIRED");
    let r = a.call(&req(
        "res2",
        Op::Resume {
            target: "never".into(),
            after_seq: 0,
        },
    ));
    assert_eq!(error(&r).0, "UNKNOWN_TARGET");
}

#[test]
fn results_are_bounded_by_bytes_and_the_newest_is_kept() {
    let ws = temp_dir("bytes");
    let mut a = Agent::spawn(&["--max-result-bytes", "3000"]);
    for i in 0..4 {
        let (_, rec) = a.run(
            &format!("b{i}"),
            &spec(Language::Python, "print('y' * 1500)", &ws),
        );
        assert_eq!(rec.verdict, Verdict::Ok);
    }
    let s = a.status("s");
    assert!(s["results_bytes"].as_u64().unwrap() <= 3000, "{s}");
    assert!(s["results_held"].as_u64().unwrap() >= 1);
    let r = a.call(&run_req(
        "b3",
        &spec(Language::Python, "print('y' * 1500)", &ws),
    ));
    assert!(matches!(r.body, Body::Result(_)));
    a.send(&run_req(
        "b0",
        &spec(Language::Python, "print('y' * 1500)", &ws),
    ));
    assert_eq!(error(&a.next()).0, "RESULT_EXPIRED");
    // One result larger than the bound is still kept (the newest always is).
    let (_, big) = a.run("big", &spec(Language::Python, "print('z' * 5000)", &ws));
    let again = a.call(&run_req(
        "big",
        &spec(Language::Python, "print('z' * 5000)", &ws),
    ));
    assert_eq!(record(&again), big);
}
