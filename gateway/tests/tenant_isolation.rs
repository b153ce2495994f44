//! Tenant isolation under load (issue "proof under attack"): a tenant flooding past its
//! calls per minute is refused with RESOURCE_EXHAUSTED and retry-after, while another
//! tenant's calls keep passing with their latency (p99 within 2x of its own unloaded p99,
//! measured in the same run, plus an absolute slack for a loaded 2-core CI machine). The
//! control: a second key of the flooding tenant, on its own connection, is refused too (the
//! limit is the tenant's, not the key's or the connection's), so the quiet tenant passes
//! because it is another tenant, not because nothing was limited.

mod abuse_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use abuse_common::{Gw, calc, calc_latencies, create_key, pct};

/// Burst and rate of the flooding tenant.
const CONFIG: &str = "\
auth:
  tenants:
    flood:
      limits: {calls_per_minute: 60, burst: 5}
    quiet: {}
";

/// Slack over 2x the unloaded p99: a CI machine with two cores runs the gateway, the
/// flooders and the measuring client together.
const SLACK: Duration = Duration::from_millis(50);

/// Each flooding caller's pace.
const PACE: Duration = Duration::from_millis(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_flooding_past_its_limit_is_refused_while_another_keeps_its_latency() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    let flood_key = create_key(&keys, "flood", "flood-1");
    let flood_key2 = create_key(&keys, "flood", "flood-2");
    let quiet_key = create_key(&keys, "quiet", "quiet-1");
    let gw = Gw::start(dir, CONFIG, &["--api-keys", keys.to_str().unwrap()]);

    let mut quiet = gw.client(Some(&quiet_key)).await;
    calc_latencies(&mut quiet, 50).await;
    let (alone, failed) = calc_latencies(&mut quiet, 300).await;
    assert!(failed.is_empty(), "quiet alone: {failed:?}");

    // The flood: four callers of tenant `flood`, each on its own connection, 100 calls a
    // second each (400 a second: 400 times the tenant's rate), never backing off on
    // retry-after. (`toolrun bench --abuse` also measures a closed loop, which saturates
    // the machine's cores rather than the tenant's limit.) They run on a runtime of
    // their own thread, so the quiet client's tasks are not queued behind theirs in this
    // process (they still share the machine's cores with it and the gateway).
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let other_answer = Arc::new(std::sync::Mutex::new(None::<String>));
    let start = Instant::now();
    let flood = {
        let (url, key) = (gw.url(), flood_key.clone());
        let (stop, counts, other_answer) = (stop.clone(), counts.clone(), other_answer.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut callers = Vec::new();
                for _ in 0..4 {
                    let mut c = toolrun::cli::connect(&url, Some(&key)).await.unwrap();
                    let (stop, counts, other_answer) =
                        (stop.clone(), counts.clone(), other_answer.clone());
                    callers.push(tokio::spawn(async move {
                        let mut pace = tokio::time::interval(PACE);
                        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        while !stop.load(Ordering::Relaxed) {
                            pace.tick().await;
                            let i = match c.call_tool(calc()).await {
                                Ok(r) if r.get_ref().result.as_ref().is_some_and(|r| r.ok) => 0,
                                Err(e)
                                    if e.code() == tonic::Code::ResourceExhausted
                                        && e.metadata().get("retry-after").is_some() =>
                                {
                                    1
                                }
                                other => {
                                    *other_answer.lock().unwrap() = Some(format!("{other:?}"));
                                    2
                                }
                            };
                            counts[i].fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                }
                for c in callers {
                    c.await.unwrap();
                }
            })
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (flooded, failed) = calc_latencies(&mut quiet, 300).await;

    // Control: the flooding tenant's other key, on a fresh connection, is refused as well.
    let mut flood2 = gw.client(Some(&flood_key2)).await;
    let control = flood2.call_tool(calc()).await;

    stop.store(true, Ordering::Relaxed);
    tokio::task::spawn_blocking(move || flood.join().unwrap())
        .await
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let [ok, exhausted, other] = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    let (p50_0, p99_0, p50_1, p99_1) = (
        pct(&alone, 0.5),
        pct(&alone, 0.99),
        pct(&flooded, 0.5),
        pct(&flooded, 0.99),
    );
    println!(
        "flood: {ok} ok, {exhausted} RESOURCE_EXHAUSTED ({:.0}/s), {other} other in {secs:.1} s; \
         quiet calculator p50/p99 alone {p50_0}/{p99_0} us, flooded {p50_1}/{p99_1} us \
         ({:.2}x at p99)",
        exhausted as f64 / secs,
        p99_1 as f64 / p99_0.max(1) as f64
    );

    assert_eq!(
        other,
        0,
        "every refusal is RESOURCE_EXHAUSTED with retry-after: {:?}",
        other_answer.lock().unwrap()
    );
    assert!(exhausted > 0, "the flood went past the limit");
    // The burst, then one a second (60 a minute), and one of slack for the refill's edge.
    let allowed = 5 + secs.ceil() as u64 + 1;
    assert!(
        ok <= allowed,
        "{ok} calls passed, more than the burst and rate allow ({allowed})"
    );
    let e = control.expect_err("the flooding tenant's other key is over the same limit");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("calls per minute"), "{e:?}");
    assert!(failed.is_empty(), "quiet was refused or failed: {failed:?}");
    let bound = 2 * p99_0 + SLACK.as_micros() as u64;
    assert!(
        p99_1 <= bound,
        "quiet's p99 under the flood ({p99_1} us) exceeds 2x its unloaded p99 + {SLACK:?} \
         ({bound} us)"
    );
}
