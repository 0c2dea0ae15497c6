//! The balloon with the Linux guest: a guest that touched 272 MiB keeps ember's RSS up after
//! it freed them; inflating the balloon by 256 MiB gives that memory back to the host (RSS
//! drops by about as much) and takes it from the guest (MemTotal drops); deflating gives it
//! back to the guest (MemTotal is whole again); statistics arrive at the polling interval.
//! (Free page reporting and hinting: linux_free_pages.rs.)
//!
//! (On kvm_pvm every page the guest kernel clears costs hundreds of emulated instructions:
//! touching 272 MiB takes about three minutes there.)

mod common;

use std::time::{Duration, Instant};

use common::api::{Client, Ember};
use common::linux::*;
use common::*;
use serde_json::{json, Value};

const MIB: u64 = 1024;

/// Polls `GET /balloon/statistics` until `done` holds for it.
fn stats_until(c: &mut Client, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    get_until(c, "/balloon/statistics", what, done)
}

#[test]
fn linux_inflating_the_balloon_gives_memory_back_to_the_host_and_deflating_to_the_guest() {
    let img = linux_images!();
    let s = Scratch::new("linux-balloon");
    let metrics = s.path("metrics.json");
    let mut ember = Ember::start(&s, &["--metrics-path", metrics.to_str().unwrap()]);
    let mut c = ember.client();
    // MemTotal (KiB) as the guest sees it: the balloon takes its pages out of it.
    let cmd = "tot() { set -- $(grep MemTotal /proc/meminfo); echo $2; }; t0=$(tot); \
               echo total0 $t0; ember-agent touch 272; \
               while [ $(tot) -gt $((t0 - 250 * 1024)) ]; do sleep 1; done; echo inflated $(tot); \
               while [ $(tot) -lt $((t0 - 1024)) ]; do sleep 1; done; echo deflated $(tot); \
               echo metrics-ready; sleep 2";
    configure(&mut c, &img, 1, 384, cmd);
    c.put(
        "/balloon",
        &json!({"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 1}),
    )
    .expect(204, "");
    c.get("/balloon/statistics")
        .expect(400, "not supported before starting");
    c.instance_start();

    ember.wait_for("ember-agent: touched 272 MiB", linux_deadline());
    std::thread::sleep(Duration::from_millis(500));
    let touched = ember.rss_kib();
    // Statistics come every second: the guest's total and free memory.
    let first = stats_until(&mut c, "first statistics", |s| s["total_memory"].is_u64());
    assert_eq!(first["target_mib"], 0);

    let started = Instant::now();
    c.patch("/balloon", &json!({"amount_mib": 256}))
        .expect(204, "");
    assert_eq!(c.get("/balloon").json()["amount_mib"], 256);
    // Statistics lag the device's count by up to an interval: wait for ones taken once the
    // guest had given the balloon its pages (its total then excludes them).
    let first_total = first["total_memory"].as_u64().unwrap();
    let full = stats_until(&mut c, "inflation", |s| {
        s["actual_mib"] == 256
            && s["total_memory"].as_u64().unwrap_or(u64::MAX) <= first_total - 250 * MIB * 1024
    });
    let inflate_time = started.elapsed();
    ember.wait_for("\ninflated ", linux_deadline());
    let inflated = ember.rss_kib();
    eprintln!(
        "RSS after touching 272 MiB {touched} KiB, after inflating 256 MiB {inflated} KiB \
         ({inflate_time:?}); stats {full}"
    );
    assert_eq!(full["target_pages"], 256 * 256);
    assert!(
        touched.saturating_sub(inflated) >= 230 * MIB,
        "RSS {touched} -> {inflated} KiB"
    );
    // The pages in the balloon are not free in the guest. (Not compared with the first
    // statistics' free memory: those may date from before or after the toucher's 272 MiB.)
    assert!(
        full["free_memory"].as_u64().unwrap() < first_total - 250 * MIB * 1024,
        "{first} {full}"
    );

    c.patch("/balloon", &json!({"amount_mib": 0}))
        .expect(204, "");
    stats_until(&mut c, "deflation", |s| s["actual_mib"] == 0);
    let (flushed, lines) = flush_and_finish(&mut ember, &mut c, &metrics);
    let total0 = field(
        lines.iter().find(|l| l.starts_with("total0")).unwrap(),
        "total0",
    );
    let low = field(
        lines.iter().find(|l| l.starts_with("inflated")).unwrap(),
        "inflated",
    );
    let back = field(
        lines.iter().find(|l| l.starts_with("deflated")).unwrap(),
        "deflated",
    );
    assert!(total0 - low >= 250 * MIB, "MemTotal {total0} -> {low} KiB");
    assert!(
        back + MIB >= total0,
        "MemTotal {total0} -> {low} -> {back} KiB"
    );
    assert!(metric_sum(&flushed, "balloon", "inflate_count") >= 256 * 256);
    assert!(metric_sum(&flushed, "balloon", "deflate_count") >= 256 * 256);
    assert!(metric_sum(&flushed, "balloon", "stats_updates_count") >= 2);
}
