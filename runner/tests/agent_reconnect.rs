//! A dropped stream, reconnected: the agent's stdin and stdout are FIFOs, as the container
//! runtime's are behind `pods/attach`. The test's reader detaches mid-run (the agent's writes
//! then fail with EPIPE), its writer closes (the agent reads end of file), and a new
//! "attach" opens both again: the agent, still running, serves the new requests, and
//! `resume` delivers exactly the events the client missed.

mod agent_support;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agent_support::*;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::stat::Mode;
use toolrun_runner::Language;
use toolrun_runner::agent::client::{Tracker, decode, encode};
use toolrun_runner::agent::proto::{Body, Op, Response};

/// Opens a FIFO's read end without waiting for a writer, then makes reads blocking.
fn open_reader(path: &Path) -> File {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap();
    fcntl(&f, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    f
}

/// Reads responses from `f` on a thread until `stop` says so (then the file is closed).
fn reader(f: File, stop: impl Fn(&Response) -> bool + Send + 'static) -> mpsc::Receiver<Response> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(f).lines() {
            let Ok(line) = line else { return };
            // A client skips a line it cannot decode (cut by an earlier detach).
            let Ok(r) = decode(&line) else { continue };
            let done = stop(&r);
            if tx.send(r).is_err() || done {
                return;
            }
        }
    });
    rx
}

#[test]
fn a_dropped_stream_is_resumed_without_loss_or_repeat() {
    let dir = temp_dir("fifo");
    let (fin, fout) = (dir.join("in"), dir.join("out"));
    nix::unistd::mkfifo(&fin, Mode::from_bits_truncate(0o600)).unwrap();
    nix::unistd::mkfifo(&fout, Mode::from_bits_truncate(0o600)).unwrap();
    let agent_in = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fin)
        .unwrap();
    let first_out = open_reader(&fout);
    let agent_out = OpenOptions::new().write(true).open(&fout).unwrap();
    let mut child = KillOnDrop(
        Command::new(RUNNER)
            .args(["agent", "--require-unreachable", "off"])
            .stdin(Stdio::from(agent_in))
            .stdout(Stdio::from(agent_out))
            .spawn()
            .unwrap(),
    );

    // First attach: send a run, read its first three events, then detach both ways.
    let code = "for i in $(seq 1 20); do echo line $i; sleep 0.05; done";
    let run = run_req("r", &spec(Language::Bash, code, &dir));
    let mut tracker = Tracker::new();
    let rx1 = reader(first_out, |r| r.id.as_deref() == Some("r") && r.seq == 3);
    let mut w1 = OpenOptions::new().write(true).open(&fin).unwrap();
    w1.write_all(encode(&run).as_bytes()).unwrap();
    drop(w1);
    let mut out = String::new();
    for r in rx1.iter() {
        for r in tracker.push(r) {
            if let Body::Stdout { data } = &r.body {
                out.push_str(data);
            }
        }
    }
    assert_eq!(tracker.last_seq("r"), 3);
    assert_eq!(out, "line 1\nline 2\nline 3\n");

    // Detached for a while: the run goes on, its lines fail with EPIPE.
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the agent died on EPIPE or EOF"
    );

    // Second attach.
    let rx2 = reader(open_reader(&fout), |r| {
        r.id.as_deref() == Some("r") && r.body.is_final()
    });
    let mut w2 = OpenOptions::new().write(true).open(&fin).unwrap();
    w2.write_all(encode(&req("h", Op::Hello)).as_bytes())
        .unwrap();
    w2.write_all(
        encode(&req(
            "res",
            Op::Resume {
                target: "r".into(),
                after_seq: tracker.last_seq("r"),
            },
        ))
        .as_bytes(),
    )
    .unwrap();
    w2.flush().unwrap();
    let deadline = Instant::now() + WAIT;
    let mut hello = None;
    let mut resumed = None;
    let mut record = None;
    let mut received = 0;
    while record.is_none() {
        let r = rx2
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the run's final event after resume");
        match r.id.as_deref() {
            Some("h") => hello = Some(ok(&r)),
            Some("res") => resumed = Some(ok(&r)),
            Some("r") => {
                assert!(r.seq > 3, "an event the client had was sent again: {r:?}");
                received += 1;
                for r in tracker.push(r) {
                    match r.body {
                        Body::Stdout { data } => out.push_str(&data),
                        Body::Result(rec) => record = Some(rec),
                        other => panic!("{other:?}"),
                    }
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let record = record.unwrap();
    let expected: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    assert_eq!(record.stdout, expected);
    assert_eq!(
        out, expected,
        "the stream, stitched across the reconnect, is the output"
    );
    let hello = hello.expect("hello answered on the new attach");
    assert!(
        hello["lines_dropped"].as_u64().unwrap() > 0,
        "no write failed while detached: {hello}"
    );
    let resumed = resumed.expect("resume answered");
    assert!(resumed["replayed"].as_u64().unwrap() > 0, "{resumed}");
    eprintln!("resume: {resumed}; events of r received on the new attach: {received}");
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The replay buffer is bounded: events dropped from it are reported as `lost`, and the
/// final record still holds all the output.
#[test]
fn a_bounded_replay_buffer_reports_what_it_lost() {
    let ws = temp_dir("lost");
    let mut a = Agent::spawn(&["--max-replay-bytes", "300"]);
    let code = "for i in $(seq 1 30); do echo line $i; sleep 0.02; done; sleep 0.5";
    a.send(&run_req("r", &spec(Language::Bash, code, &ws)));
    std::thread::sleep(Duration::from_millis(900));
    a.send(&req(
        "res",
        Op::Resume {
            target: "r".into(),
            after_seq: 0,
        },
    ));
    // Skip the live events, up to the resume's answer; what precedes it is the replay.
    let mut replay = Vec::new();
    let mut in_replay = false;
    loop {
        let r = a.next();
        if r.id.as_deref() == Some("res") {
            assert!(ok(&r)["replayed"].as_u64().unwrap() > 1);
            break;
        }
        if let Body::Lost { .. } = r.body {
            in_replay = true;
        }
        if in_replay {
            replay.push(r);
        }
    }
    let Body::Lost {
        first_seq,
        last_seq,
    } = replay[0].body
    else {
        panic!("{:?}", replay[0])
    };
    assert_eq!(first_seq, 1);
    assert!(last_seq > 1 && last_seq < 30, "{last_seq}");
    assert_eq!(replay[0].seq, last_seq);
    assert_eq!(replay[1].seq, last_seq + 1, "the buffer holds the rest");
    let rec = record(&a.final_of("r"));
    assert_eq!(rec.stdout.lines().count(), 30);
}
