//! The agent's runs, control ops and robustness against bad input: the built binary as a
//! child process over pipes.

mod agent_support;

use std::time::{Duration, Instant};

use agent_support::*;
use toolrun_runner::agent::proto::{Body, Op};
use toolrun_runner::{Language, Verdict};

#[test]
fn hello_and_status() {
    let ws = temp_dir("hello");
    let mut a = Agent::spawn(&["--workspace", ws.to_str().unwrap()]);
    let r = a.call(&req("h", Op::Hello));
    assert_eq!((r.id.as_deref(), r.seq), (Some("h"), 1));
    let s = ok(&r);
    assert_eq!(s["protocol_version"], 1);
    assert_eq!(s["record_version"], toolrun_runner::PROTOCOL_VERSION);
    assert_eq!(s["agent_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["workspace"], ws.to_str().unwrap());
    assert_eq!(s["run_active"], false);
    assert_eq!(s["requests_served"], 0);
    assert_eq!(s["pid1"], false);
    assert_eq!(s["isolation"]["state"], "disabled");
    a.run("r1", &spec(Language::Bash, "true", &ws));
    let s = a.status("s");
    assert_eq!(s["requests_served"], 1);
    assert_eq!(s["results_held"], 1);
    assert!(s["uptime_ms"].as_u64().is_some());
}

/// The agent's records equal the one-shot runner's for the same spec (durations aside), and
/// the chunks stream before the record.
#[test]
fn runs_match_the_one_shot_runner() {
    let ws = temp_dir("runs");
    let mut a = Agent::spawn(&["--workspace", ws.to_str().unwrap()]);
    let mut cases = [
        spec(
            Language::Python,
            "import sys\nprint('hi')\nprint('e', file=sys.stderr)",
            &ws,
        ),
        spec(Language::Bash, "echo out; echo err >&2; exit 3", &ws),
        spec(Language::Bash, "kill -9 $$", &ws),
        spec(
            Language::Python,
            "while True: print('x' * 100, flush=True)",
            &ws,
        ),
        spec(Language::Bash, "sleep 30", &ws),
    ];
    cases[3].limits.output_limit_bytes = 1000;
    cases[4].limits.timeout_ms = 300;
    let expected = [
        Verdict::Ok,
        Verdict::RuntimeError,
        Verdict::RuntimeError,
        Verdict::OutputLimit,
        Verdict::Timeout,
    ];
    for (i, (s, want)) in cases.iter().zip(expected).enumerate() {
        let (events, got) = a.run(&format!("run-{i}"), s);
        let mut direct = one_shot(s);
        assert_eq!(got.verdict, want, "{i}: {got:?}");
        direct.duration_ms = got.duration_ms;
        assert_eq!(got, direct, "case {i}: agent and one-shot records differ");
        // Streamed chunks add up to the record's stdout, in seq order.
        assert_eq!(streamed_stdout(&events), got.stdout, "case {i}");
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    }
}

#[test]
fn output_streams_while_the_program_runs() {
    let ws = temp_dir("stream");
    let mut a = Agent::spawn(&[]);
    a.send(&run_req(
        "s",
        &spec(Language::Bash, "echo first; sleep 1; echo second", &ws),
    ));
    let t = Instant::now();
    let first = a.next();
    assert_eq!(
        first.body,
        Body::Stdout {
            data: "first\n".into()
        }
    );
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    let rest = a.collect("s");
    assert!(t.elapsed() >= Duration::from_millis(900));
    assert_eq!(record(rest.last().unwrap()).stdout, "first\nsecond\n");
}

#[test]
fn runs_queue_one_at_a_time_and_file_ops_run_beside_them() {
    let ws = temp_dir("queue");
    let mut a = Agent::spawn(&["--workspace", ws.to_str().unwrap()]);
    // Run 2 only sees the marker if run 1 finished before it started.
    a.send(&run_req(
        "q1",
        &spec(Language::Bash, "sleep 0.7; echo done > marker", &ws),
    ));
    a.send(&run_req("q2", &spec(Language::Bash, "cat marker", &ws)));
    std::thread::sleep(Duration::from_millis(200));
    let s = a.status("st");
    assert_eq!(s["run_active"], true);
    assert_eq!(s["active_run"], "q1");
    assert_eq!(s["runs_queued"], 1);
    // A file op during the run answers before the run ends.
    let t = Instant::now();
    let r = a.call(&file_op(
        "ls",
        toolrun_runner::agent::proto::FileOpKind::ListDirectory,
        args_path("."),
    ));
    ok(&r);
    assert!(
        t.elapsed() < Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(record(&a.final_of("q1")).verdict, Verdict::Ok);
    let r2 = record(&a.final_of("q2"));
    assert_eq!((r2.verdict, r2.stdout.as_str()), (Verdict::Ok, "done\n"));
}

#[test]
fn kill_a_running_and_a_queued_run() {
    let ws = temp_dir("kill");
    let mut a = Agent::spawn(&[]);
    a.send(&run_req(
        "long",
        &spec(Language::Bash, "echo started; sleep 60 & wait", &ws),
    ));
    a.send(&run_req("queued", &spec(Language::Bash, "touch ran", &ws)));
    assert_eq!(
        a.next().body,
        Body::Stdout {
            data: "started\n".into()
        }
    );
    let t = Instant::now();
    let k = a.call(&req(
        "k1",
        Op::Kill {
            target: "queued".into(),
        },
    ));
    assert_eq!(ok(&k)["state"], "queued");
    let q = record(&a.final_of("queued"));
    assert_eq!(q.verdict, Verdict::Cancelled);
    let k = a.call(&req(
        "k2",
        Op::Kill {
            target: "long".into(),
        },
    ));
    assert_eq!(ok(&k)["state"], "running");
    let rec = record(&a.final_of("long"));
    assert_eq!(rec.verdict, Verdict::Cancelled, "{rec:?}");
    assert_eq!(rec.stdout, "started\n");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(!ws.join("ran").exists(), "the queued run ran");
    // Killing a finished run does nothing; an unknown id is a typed error.
    let k = a.call(&req(
        "k3",
        Op::Kill {
            target: "long".into(),
        },
    ));
    assert_eq!(ok(&k)["state"], "finished");
    a.send(&req(
        "k4",
        Op::Kill {
            target: "nope".into(),
        },
    ));
    let r = a.next();
    assert_eq!(error(&r).0, "UNKNOWN_TARGET");
    // The agent still runs programs.
    let (_, rec) = a.run("after", &spec(Language::Bash, "echo ok", &ws));
    assert_eq!(rec.verdict, Verdict::Ok);
}

/// Malformed, unknown, oversize and invalid requests each get a typed error (with the id when
/// it can be read), and the agent keeps serving.
#[test]
fn bad_input_gets_typed_errors_and_the_agent_keeps_serving() {
    let ws = temp_dir("bad");
    let mut a = Agent::spawn(&[
        "--workspace",
        ws.to_str().unwrap(),
        "--max-line-bytes",
        "4096",
    ]);
    let cases: Vec<(String, Option<&str>, &str)> = vec![
        ("not json".into(), None, "BAD_REQUEST"),
        ("[1,2]".into(), None, "BAD_REQUEST"),
        (r#"{"op":"hello"}"#.into(), None, "BAD_REQUEST"),
        (r#"{"id":7,"op":"hello"}"#.into(), None, "BAD_REQUEST"),
        (
            format!(r#"{{"id":"{}","op":"hello"}}"#, "x".repeat(300)),
            None,
            "BAD_REQUEST",
        ),
        (r#"{"id":"a"}"#.into(), Some("a"), "BAD_REQUEST"),
        (
            r#"{"id":"b","op":"explode"}"#.into(),
            Some("b"),
            "UNKNOWN_OP",
        ),
        (
            r#"{"id":"c","op":"run","spec":{"language":"cobol"}}"#.into(),
            Some("c"),
            "INVALID_ARGUMENTS",
        ),
        (
            r#"{"id":"d","op":"kill"}"#.into(),
            Some("d"),
            "INVALID_ARGUMENTS",
        ),
        (
            format!(r#"{{"id":"e","op":"hello","pad":"{}"}}"#, "y".repeat(5000)),
            None,
            "LINE_TOO_LONG",
        ),
        ("\u{0}\u{1}\u{ff}".into(), None, "BAD_REQUEST"),
    ];
    for (line, id, code) in &cases {
        a.send_raw(format!("{line}\n"));
        let r = a.next();
        assert_eq!(r.id.as_deref(), *id, "{line:.60}");
        assert_eq!(r.seq, 0, "{line:.60}");
        assert_eq!(error(&r).0, *code, "{line:.60}: {r:?}");
    }
    // Invalid bytes (not UTF-8) in a line.
    a.send_raw(b"{\"id\":\"f\",\xff}\n");
    assert_eq!(error(&a.next()).0, "BAD_REQUEST");
    // A file op whose args do not fit the tool's type.
    let r = a.call(&file_op(
        "g",
        toolrun_runner::agent::proto::FileOpKind::ReadFile,
        serde_json::json!({"path": 5, "extra": true}),
    ));
    assert_eq!(error(&r).0, "INVALID_ARGUMENTS");
    // A run asking for more output than the agent holds.
    let mut big = spec(Language::Bash, "true", &ws);
    big.limits.output_limit_bytes = 1 << 40;
    let r = a.call(&run_req("h", &big));
    assert_eq!(error(&r).0, "INVALID_ARGUMENTS");
    // Still serving.
    assert_eq!(ok(&a.call(&req("hi", Op::Hello)))["protocol_version"], 1);
    let (_, rec) = a.run("ok", &spec(Language::Bash, "echo fine", &ws));
    assert_eq!(rec.stdout, "fine\n");
    assert!(a.child.try_wait().unwrap().is_none());
}

/// A program that kills its own runner (same uid) leaves an INFRA_ERROR record with the
/// output relayed so far, never a hang.
#[test]
fn a_runner_killed_by_its_program_ends_as_infra_error() {
    let ws = temp_dir("runner-killed");
    let mut a = Agent::spawn(&[]);
    let t = Instant::now();
    let (_, rec) = a.run(
        "k",
        &spec(
            Language::Bash,
            "echo before; sleep 0.2; kill -9 $PPID; sleep 30",
            &ws,
        ),
    );
    assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
    assert!(rec.message.contains("without a record"), "{rec:?}");
    assert!(rec.message.contains("signal: 9"), "{rec:?}");
    assert_eq!(rec.stdout, "before\n");
    assert!(t.elapsed() < Duration::from_secs(10));
}
