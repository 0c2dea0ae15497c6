//! Free memory going back to the host with the Linux guest: free page reporting (the guest
//! reports what it frees, on 4 KiB and on 2 MiB huge pages) and free page hinting (in runs
//! the host starts through the API). Each test measures ember's memory against what its
//! guest touched, so they run one after the other.

mod common;

use common::api::{Client, Ember};
use common::linux::*;
use common::*;
use serde_json::{json, Value};

const MIB: u64 = 1024;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Free page reporting: memory the guest touched and freed goes back to the host without any
/// balloon target (the driver reports free blocks of 2 MiB and more, about 2 s after they
/// are freed): ember's RSS ends near where it was before the guest touched 64 MiB.
#[test]
fn linux_free_page_reporting_gives_memory_the_guest_freed_back_to_the_host() {
    let img = linux_images!();
    reporting_gives_back(&img, None);
}

/// The same on 2 MiB huge pages: the reported blocks are whole huge pages, which go back to
/// the host's pool (the guest's 4 KiB balloon pages could not).
#[test]
fn linux_free_page_reporting_on_huge_pages_gives_whole_huge_pages_back() {
    let img = linux_images!();
    let pool = or_skip!(huge_pages::huge_pages_or_skip, 128);
    reporting_gives_back(&img, Some(&pool));
}

/// Adds a balloon of 0 MiB with `feature` (`free_page_reporting` or `free_page_hinting`)
/// on, which the configuration then shows, and starts the guest.
fn start_with_balloon_feature(c: &mut Client, feature: &str) {
    let mut balloon = json!({"amount_mib": 0, "deflate_on_oom": false});
    balloon[feature] = true.into();
    c.put("/balloon", &balloon).expect(204, "");
    assert_eq!(c.get("/balloon").json()[feature], true);
    c.instance_start();
}

/// Touches and frees 64 MiB in a 256 MiB guest with reporting on, and checks that ember's
/// memory (RSS, or its huge pages) ends near where it was before.
fn reporting_gives_back(img: &Images, huge: Option<&huge_pages::HugePool>) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("linux-reporting");
    let metrics = s.path("metrics.json");
    let mut ember = Ember::start(&s, &["--metrics-path", metrics.to_str().unwrap()]);
    let mut c = ember.client();
    let cmd =
        "echo before-touch; sleep 2; ember-agent touch 64; sleep 15; echo metrics-ready; sleep 2";
    configure(&mut c, img, 1, 256, cmd);
    if huge.is_some() {
        c.patch("/machine-config", &json!({"huge_pages": "2M"}))
            .expect(204, "");
    }
    start_with_balloon_feature(&mut c, "free_page_reporting");
    let pid = ember.child.id();
    let held = |ember: &Ember| match huge {
        Some(_) => huge_pages::huge_resident_kib(pid),
        None => ember.rss_kib(),
    };
    ember.wait_for("\nbefore-touch", linux_deadline());
    let before = held(&ember);
    ember.wait_for("ember-agent: touched 64 MiB", linux_deadline());
    ember.wait_for("\nmetrics-ready", linux_deadline());
    let after = held(&ember);
    let (flushed, _) = flush_and_finish(&mut ember, &mut c, &metrics);
    let freed = metric_sum(&flushed, "balloon", "free_page_report_freed");
    eprintln!(
        "{} before touching {before} KiB, 15 s after freeing {after} KiB; reported {freed} B",
        if huge.is_some() {
            "huge pages held"
        } else {
            "RSS"
        }
    );
    assert!(freed >= 48 << 20, "reported free: {freed} B");
    assert_eq!(metric_sum(&flushed, "balloon", "free_page_report_fails"), 0);
    // Without reporting the 64 MiB would stay with ember.
    assert!(
        after < before + 24 * MIB,
        "{before} KiB before touching, {after} KiB after"
    );
    if huge.is_some() {
        assert!(
            before > 0 && before % 2048 == 0,
            "{before} KiB of huge pages"
        );
    }
}

/// Polls `GET /balloon/hinting/status` until `done` holds for it; checks its shape each time.
fn hinting_until(c: &mut Client, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let shapes = common::shapes::Shapes::load();
    get_until(c, "/balloon/hinting/status", what, |status| {
        let problems = shapes.check(status, "BalloonHintingStatus", "/balloon/hinting/status");
        assert!(problems.is_empty(), "{problems:?}");
        done(status)
    })
}

/// Free page hinting: a guest that touched and freed 64 MiB keeps ember's RSS up until the
/// host starts a hinting run; the driver then hands over its free memory in 4 MiB blocks,
/// which go back to the host, and sends STOP; Ember answers DONE by itself (the default
/// `acknowledge_on_stop`) and the driver frees the blocks again. A second run without the
/// acknowledgement waits at STOP until `PATCH /balloon/hinting/stop`. The guest then touches
/// 64 MiB again: the hinted memory works as before.
#[test]
fn linux_free_page_hinting_gives_free_memory_back_in_runs_the_host_starts() {
    let img = linux_images!();
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let s = Scratch::new("linux-hinting");
    let metrics = s.path("metrics.json");
    let mut ember = Ember::start(&s, &["--metrics-path", metrics.to_str().unwrap()]);
    let mut c = ember.client();
    let cmd = "echo before-touch; sleep 2; ember-agent touch 64; echo touched-once; sleep 30; \
               ember-agent touch 64; echo metrics-ready; sleep 2";
    configure(&mut c, &img, 1, 256, cmd);
    start_with_balloon_feature(&mut c, "free_page_hinting");
    ember.wait_for("\nbefore-touch", linux_deadline());
    let before = ember.rss_kib();
    ember.wait_for("\ntouched-once", linux_deadline());
    let touched = ember.rss_kib();
    assert_eq!(
        c.get("/balloon/hinting/status").json(),
        json!({"host_cmd": 0, "guest_cmd": null}),
        "no run yet"
    );

    // Run 1 (ID 2), acknowledged by Ember at the driver's STOP.
    c.request("PATCH", "/balloon/hinting/start", None)
        .expect(204, "");
    hinting_until(&mut c, "run 1 acknowledged", |s| {
        *s == json!({"host_cmd": 1, "guest_cmd": 0})
    });
    let hinted = ember.rss_kib();

    // Run 2 (ID 3) waits at STOP for the host's DONE.
    c.patch(
        "/balloon/hinting/start",
        &json!({"acknowledge_on_stop": false}),
    )
    .expect(204, "");
    hinting_until(&mut c, "run 2 stopped by the driver", |s| {
        *s == json!({"host_cmd": 3, "guest_cmd": 0})
    });
    c.request("PATCH", "/balloon/hinting/stop", None)
        .expect(204, "");
    assert_eq!(
        c.get("/balloon/hinting/status").json(),
        json!({"host_cmd": 1, "guest_cmd": 0})
    );

    let (flushed, _) = flush_and_finish(&mut ember, &mut c, &metrics);
    let freed = metric_sum(&flushed, "balloon", "free_page_hint_freed");
    let blocks = metric_sum(&flushed, "balloon", "free_page_hint_count");
    eprintln!(
        "RSS before touching {before} KiB, after {touched} KiB, after run 1 {hinted} KiB; \
         {blocks} blocks, {freed} B hinted"
    );
    assert!(touched > before + 48 * MIB, "RSS {before} -> {touched} KiB");
    assert!(
        hinted < touched - 48 * MIB,
        "RSS {touched} KiB before the run, {hinted} KiB after"
    );
    // Two runs over a guest with about 200 MiB free (in whole 4 MiB blocks: about half).
    assert!(freed >= 2 * (48 << 20), "hinted: {freed} B");
    assert_eq!(metric_sum(&flushed, "balloon", "free_page_hint_fails"), 0);
    let out = ember.stdout();
    let touches = out.matches("ember-agent: touched 64 MiB").count();
    assert_eq!(
        touches, 2,
        "the guest touched 64 MiB again after the runs:\n{out}"
    );
}
