//! The entropy device with the Linux guest: the kernel's virtio-rng driver becomes the
//! current hardware RNG, `/dev/hwrng` gives random bytes (every byte value appears), the
//! metrics count what the guest read, and a bandwidth limiter bounds the rate the guest
//! measures.

mod common;

use common::api::Ember;
use common::linux::*;
use common::*;
use serde_json::json;

/// Well below what this host gives unlimited (about 15 KB/s on kvm_pvm, where each small
/// request runs through the emulated guest kernel).
const RATE: u64 = 1024;

#[test]
fn linux_reads_random_bytes_from_the_entropy_device_and_a_limiter_bounds_the_rate() {
    let img = linux_images!();
    // Unlimited first, then (another microVM) held to RATE bytes a second, measured after
    // twice the bucket.
    let mut rates = Vec::new();
    for limiter in [
        None,
        Some(json!({"bandwidth": {"size": RATE, "refill_time": 1000}})),
    ] {
        let s = Scratch::new("linux-entropy");
        let metrics = s.path("metrics.json");
        let mut ember = Ember::start(&s, &["--metrics-path", metrics.to_str().unwrap()]);
        let mut c = ember.client();
        let read = match limiter {
            None => "ember-agent read /dev/hwrng 65536".to_string(),
            Some(_) => format!("ember-agent read /dev/hwrng {} {}", 4 * RATE, 2 * RATE),
        };
        let cmd = format!(
            "echo rng $(cat /sys/class/misc/hw_random/rng_current); {read}; echo metrics-ready; sleep 3"
        );
        configure(&mut c, &img, 1, 128, &cmd);
        let body = match &limiter {
            None => json!({}),
            Some(l) => json!({"rate_limiter": l}),
        };
        c.put("/entropy", &body).expect(204, "");
        c.instance_start();
        let (flushed, lines) = flush_and_finish(&mut ember, &mut c, &metrics);
        assert!(lines.iter().any(|l| l == "rng virtio_rng.0"), "{lines:#?}");
        let line = lines
            .iter()
            .find(|l| l.starts_with("ember-agent: read "))
            .unwrap_or_else(|| panic!("{lines:#?}"));
        assert!(field(line, "distinct") >= 250, "{line}");
        // Every byte the guest read came from the device (the kernel may have read more).
        let given = metric_sum(&flushed, "entropy", "entropy_bytes");
        assert!(given >= field(line, "bytes"), "{given} bytes given: {line}");
        if limiter.is_some() {
            assert!(metric_sum(&flushed, "entropy", "entropy_rate_limiter_throttled") > 0);
        }
        rates.push(field(line, "rate_bps"));
    }
    let (unlimited, limited) = (rates[0], rates[1]);
    eprintln!("unlimited {unlimited} B/s, limited to {RATE}: {limited} B/s");
    assert!(limited <= RATE + RATE / 20, "limited {limited} B/s");
    assert!(limited >= RATE / 2, "limited {limited} B/s");
    assert!(unlimited > 4 * RATE, "unlimited {unlimited} B/s");
}
