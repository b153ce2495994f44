//! The seed's code-executor table, on the local sandbox.

mod sandbox_common;

use sandbox_common::*;
use toolrun_runner::{Language, Verdict};

#[tokio::test]
async fn print_hello() {
    let rec = py("print(\"hello\")").await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert_eq!(rec.exit_code, 0);
    assert_eq!(rec.stdout, "hello\n");
}

#[tokio::test]
async fn division_by_zero_is_a_runtime_error() {
    let rec = py("1/0").await;
    assert_eq!(rec.verdict, Verdict::RuntimeError, "{rec:?}");
    assert_ne!(rec.exit_code, 0);
    assert!(rec.stderr.contains("ZeroDivisionError"), "{rec:?}");
}

#[tokio::test]
async fn infinite_loop_times_out() {
    let rec = run_spec(spec(Language::Python, "while True: pass", 1_000)).await;
    assert_eq!(rec.verdict, Verdict::Timeout, "{rec:?}");
    assert!(rec.timed_out);
}

/// Import socket works, nothing is reachable: a listener of the test's on the host's
/// loopback, which the same program run on the host does reach (the control), and two
/// internet addresses; in the sandbox every connect fails with ENETUNREACH (101).
#[tokio::test]
async fn import_socket_works_but_nothing_is_reachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "import socket\n\
         for host in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:\n\
         \x20   s = socket.socket()\n\
         \x20   s.settimeout(1)\n\
         \x20   try:\n\
         \x20       s.connect(host)\n\
         \x20       print('CONNECTED', host[0])\n\
         \x20   except OSError as e:\n\
         \x20       print('failed', host[0], e.errno)\n\
         \x20   if host[0] == '127.0.0.1' and HOST: break\n"
    );
    let host = host_python(&format!("HOST = True\n{code}"));
    assert_eq!(host, "CONNECTED 127.0.0.1\n", "control");
    while listener.accept().is_ok() {}
    let rec = py(&format!("HOST = False\n{code}")).await;
    assert_eq!(rec.verdict, Verdict::Ok, "{rec:?}");
    assert_eq!(
        rec.stdout, "failed 127.0.0.1 101\nfailed 1.1.1.1 101\nfailed 8.8.8.8 101\n",
        "{rec:?}"
    );
    assert!(listener.accept().is_err(), "the host listener was reached");
}

#[tokio::test]
async fn javascript_and_bash_run_with_args() {
    let mut run = spec(
        Language::Javascript,
        "console.log(process.argv.slice(2).join(','))",
        3_000,
    );
    run.spec.args = vec!["--version".into(), "b".into()];
    let rec = run_spec(run).await;
    assert_eq!(
        (rec.verdict, rec.stdout.as_str()),
        (Verdict::Ok, "--version,b\n"),
        "{rec:?}"
    );
    let mut run = spec(
        Language::Bash,
        "echo \"$0 $1 $2\"; read x; echo got $x",
        3_000,
    );
    run.spec.args = vec!["one".into(), "two".into()];
    run.spec.stdin = "input\n".into();
    let rec = run_spec(run).await;
    assert_eq!(rec.stdout, "bash one two\ngot input\n", "{rec:?}");
}
