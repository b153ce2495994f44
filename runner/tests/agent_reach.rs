//! Fail closed: with a reachable target (a local TCP listener standing for the API server)
//! every run is refused with INFRA_ERROR naming the cause; the control, an address nothing
//! listens on, runs. The same check in the one-shot mode.

mod agent_support;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use agent_support::*;
use toolrun_runner::{Event, Language, RunRecord, Verdict};

/// An address with nothing listening (bound, then closed: connects are refused).
fn closed_port() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    addr
}

#[test]
fn a_reachable_target_refuses_every_run() {
    let ws = temp_dir("reach");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut a = Agent::spawn(&[
        "--require-unreachable",
        &addr,
        "--unreachable-wait-ms",
        "500",
    ]);
    let t = Instant::now();
    for i in 0..2 {
        let (_, rec) = a.run(&format!("r{i}"), &spec(Language::Bash, "touch ran", &ws));
        assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
        assert!(
            rec.message.contains(&format!("the API server {addr}"))
                && rec.message.contains("is reachable from the sandbox")
                && rec.message.contains("network isolation is not in force"),
            "{}",
            rec.message
        );
    }
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "no bounded wait: {:?}",
        t.elapsed()
    );
    assert!(!ws.join("ran").exists(), "a program ran");
    let s = a.status("s");
    assert_eq!(s["isolation"]["state"], "reachable");
    assert_eq!(s["isolation"]["target"], addr.as_str());

    // Control: nothing listens there.
    let closed = closed_port();
    let mut a = Agent::spawn(&[
        "--require-unreachable",
        &closed,
        "--unreachable-wait-ms",
        "500",
    ]);
    let (_, rec) = a.run("ok", &spec(Language::Bash, "touch ran", &ws));
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert!(ws.join("ran").exists());
    let s = a.status("s");
    assert_eq!(s["isolation"]["state"], "isolated");
    assert!(
        s["isolation"]["message"]
            .as_str()
            .unwrap()
            .contains("refused"),
        "{s}"
    );
    drop(listener);
}

/// The isolation comes into force during the wait (the listener closes after 300 ms): the
/// run waits for it, then runs.
#[test]
fn a_target_that_becomes_unreachable_within_the_wait_lets_runs_start() {
    let ws = temp_dir("reach-late");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let t = Instant::now();
    let mut a = Agent::spawn(&[
        "--require-unreachable",
        &addr,
        "--unreachable-wait-ms",
        "5000",
    ]);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(listener);
    });
    let (_, rec) = a.run("r", &spec(Language::Bash, "echo ran", &ws));
    assert_eq!(
        (rec.verdict, rec.stdout.as_str()),
        (Verdict::Ok, "ran\n"),
        "{rec:?}"
    );
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(a.status("s")["isolation"]["state"], "isolated");
}

/// `auto` (the agent's default) takes the API server from KUBERNETES_SERVICE_HOST/PORT.
#[test]
fn auto_reads_the_kubernetes_service_environment() {
    let ws = temp_dir("reach-auto");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let mut cmd = Command::new(RUNNER);
    cmd.arg("agent")
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", &port);
    let mut a = Agent::spawn_cmd(
        cmd,
        &[
            "--require-unreachable",
            "auto",
            "--unreachable-wait-ms",
            "300",
        ],
    );
    let (_, rec) = a.run("r", &spec(Language::Bash, "true", &ws));
    assert_eq!(rec.verdict, Verdict::InfraError);
    assert!(
        rec.message.contains(&format!("127.0.0.1:{port}")),
        "{}",
        rec.message
    );
}

/// The watch after the first check: the target is unreachable when the agent starts (as a
/// pod's is before the policy controller programs it, whatever the policy) and becomes
/// reachable while a program runs. The program is killed, the run ends INFRA_ERROR naming the
/// cause, later runs are refused. Control: the same sequence with the watch off
/// (`--recheck-interval-ms 0`) runs the program to its end.
#[test]
fn a_target_that_becomes_reachable_later_kills_the_run_and_refuses_the_next() {
    for watch in [true, false] {
        let ws = temp_dir(if watch {
            "reach-watch"
        } else {
            "reach-nowatch"
        });
        let closed = closed_port();
        let recheck = if watch { "200" } else { "0" };
        let mut a = Agent::spawn(&[
            "--require-unreachable",
            &closed,
            "--unreachable-wait-ms",
            "500",
            "--recheck-interval-ms",
            recheck,
        ]);
        // The first check has passed before the address opens.
        let mut n = 0;
        while a.status(&format!("s0-{n}"))["isolation"]["state"] != "isolated" {
            assert!(n < 100, "the first check did not pass");
            n += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
        a.send(&run_req(
            "long",
            &spec(Language::Bash, "echo started; sleep 3; touch finished", &ws),
        ));
        // The address opens (a listener on the closed port): the pod's isolation is gone.
        let listener = TcpListener::bind(&closed).unwrap();
        let t = Instant::now();
        let rec = record(&a.final_of("long"));
        if !watch {
            assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
            assert!(ws.join("finished").exists());
            assert_eq!(a.status("s1")["isolation"]["state"], "isolated");
            continue;
        }
        assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
        assert!(
            rec.message.contains(&closed)
                && rec.message.contains("became reachable from the sandbox")
                && rec.message.contains("the running program was killed"),
            "{}",
            rec.message
        );
        assert!(
            t.elapsed() < Duration::from_millis(2500),
            "killed only after {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(3000));
        assert!(!ws.join("finished").exists(), "the program ran on");
        let (_, rec) = a.run("next", &spec(Language::Bash, "touch ran", &ws));
        assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
        assert!(!ws.join("ran").exists(), "a program ran");
        let s = a.status("s1");
        assert_eq!(s["isolation"]["state"], "reachable", "{s}");
        drop(listener);
    }
}

fn one_shot_with(args: &[&str], env: &[(&str, &str)], ws: &std::path::Path) -> RunRecord {
    one_shot_record(spawn_one_shot(
        args,
        env,
        &spec(Language::Bash, "echo ran", ws),
    ))
}

#[test]
fn the_one_shot_runner_checks_behind_the_same_flag_and_env() {
    let ws = temp_dir("reach-oneshot");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let port = listener.local_addr().unwrap().port().to_string();
    let rec = one_shot_with(
        &[
            "--require-unreachable",
            &addr,
            "--unreachable-wait-ms",
            "300",
        ],
        &[],
        &ws,
    );
    assert_eq!(rec.verdict, Verdict::InfraError);
    assert!(
        rec.message.contains(&addr) && rec.message.contains("not in force"),
        "{}",
        rec.message
    );
    let rec = one_shot_with(
        &[],
        &[
            ("TOOLRUN_REQUIRE_UNREACHABLE", "auto"),
            ("TOOLRUN_UNREACHABLE_WAIT_MS", "300"),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
        &ws,
    );
    assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
    // Controls: off by default in one-shot mode even with the service environment set, and a
    // closed port passes.
    let rec = one_shot_with(
        &[],
        &[
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", &port),
        ],
        &ws,
    );
    assert_eq!((rec.verdict, rec.stdout.as_str()), (Verdict::Ok, "ran\n"));
    let closed = closed_port();
    let rec = one_shot_with(&["--require-unreachable", &closed], &[], &ws);
    assert_eq!((rec.verdict, rec.stdout.as_str()), (Verdict::Ok, "ran\n"));
    // A re-check interval that is not a number is refused like the wait.
    let rec = one_shot_with(
        &["--require-unreachable", &closed, "--recheck-interval-ms=1s"],
        &[],
        &ws,
    );
    assert_eq!(rec.verdict, Verdict::InfraError, "{rec:?}");
    assert!(
        rec.message.contains("re-check interval \"1s\""),
        "{}",
        rec.message
    );
    drop(listener);
}

/// The one-shot runner's watch: the first check against a closed port passes and the program
/// starts (`echo started`, a background job, `sleep 3`); once its first line is out the port
/// opens (a listener binds it, as a pod's API server becomes reachable once the policy
/// controller has programmed a pod no policy selects). Returns the record, the time from the
/// opening to the record, and the workspace once the program would have finished.
fn one_shot_opened_while_running(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    max_open_files: u64,
) -> (RunRecord, Duration, std::path::PathBuf, String) {
    use std::io::BufRead;
    let ws = temp_dir(name);
    let closed = closed_port();
    let mut s = spec(
        Language::Bash,
        "(sleep 2.5; touch orphan) & echo started; sleep 3; touch finished",
        &ws,
    );
    s.limits.max_open_files = max_open_files;
    let args: Vec<&str> = ["--require-unreachable", closed.as_str()]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let mut child = spawn_one_shot(&args, env, &s);
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = Event::parse(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        first,
        Event::Stdout {
            data: "started\n".into()
        }
    );
    let listener = TcpListener::bind(&closed).unwrap();
    let opened = Instant::now();
    let mut rec = None;
    for line in lines {
        if let Event::Result(r) = Event::parse(&line.unwrap()).unwrap() {
            rec = Some(r);
        }
    }
    let took = opened.elapsed();
    assert!(child.wait().unwrap().success());
    drop(listener);
    // Past the program's end, had it not been killed.
    std::thread::sleep(Duration::from_millis(3500).saturating_sub(opened.elapsed()));
    (rec.expect("no record"), took, ws, closed)
}

/// The smallest RLIMIT_NOFILE under which the runner starts `bash -c true`.
fn tightest_open_files() -> u64 {
    let ws = temp_dir("reach-nofile");
    (3..64)
        .find(|&n| {
            let mut s = spec(Language::Bash, "true", &ws);
            s.limits.max_open_files = n;
            let out = spawn_one_shot(&[], &[], &s).wait_with_output().unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            matches!(
                Event::parse(text.lines().last().unwrap()).unwrap(),
                Event::Result(r) if r.verdict == Verdict::Ok
            )
        })
        .expect("bash starts under no RLIMIT_NOFILE below 64")
}

/// The one-shot runner re-checks while its program runs (default every second, on with the
/// first check): the target opening kills the program and its background job, the record is
/// INFRA_ERROR naming the cause and keeps the output printed before. Also under the tightest
/// RLIMIT_NOFILE the program starts with (the watch's socket is the runner's, under the limit
/// it sets on itself). Controls: the watch off by flag or by environment variable runs the
/// program to its end.
#[test]
fn the_one_shot_runner_kills_its_program_when_the_target_becomes_reachable() {
    let nofile = tightest_open_files();
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        u64,
        bool,
    );
    let cases: Vec<Case> = vec![
        ("oneshot-watch", &[], &[], 0, true),
        ("oneshot-watch-nofile", &[], &[], nofile, true),
        (
            "oneshot-flag-off",
            &["--recheck-interval-ms", "0"],
            &[],
            0,
            false,
        ),
        (
            "oneshot-env-off",
            &[],
            &[("TOOLRUN_RECHECK_INTERVAL_MS", "0")],
            0,
            false,
        ),
    ];
    let runs: Vec<_> = cases
        .into_iter()
        .map(|(name, args, env, nofile, watched)| {
            let run =
                std::thread::spawn(move || one_shot_opened_while_running(name, args, env, nofile));
            (name, watched, run)
        })
        .collect();
    for (name, watched, run) in runs {
        let (rec, took, ws, closed) = run.join().unwrap();
        if !watched {
            assert_eq!(
                (rec.verdict, rec.stdout.as_str()),
                (Verdict::Ok, "started\n"),
                "{name}: {rec:?}"
            );
            assert!(
                ws.join("finished").exists() && ws.join("orphan").exists(),
                "{name}"
            );
            continue;
        }
        assert_eq!(rec.verdict, Verdict::InfraError, "{name}: {rec:?}");
        assert!(
            rec.message.contains(&closed)
                && rec.message.contains("became reachable from the sandbox")
                && rec.message.contains("after the runner started")
                && rec.message.contains("the running program was killed"),
            "{name}: {}",
            rec.message
        );
        assert_eq!(
            rec.stdout, "started\n",
            "{name}: the output before the kill"
        );
        assert!(
            took < Duration::from_millis(2000),
            "{name}: killed only after {took:?}"
        );
        assert!(!ws.join("finished").exists(), "{name}: the program ran on");
        assert!(
            !ws.join("orphan").exists(),
            "{name}: its background job ran on"
        );
    }
}
