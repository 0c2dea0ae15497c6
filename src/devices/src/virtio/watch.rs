//! Registering a device's descriptors with the event loop.

use event_manager::{EventOps, Events};

/// Watches each of `events`; one the event loop refuses is counted in `fails` and logged
/// for `device` (the device then misses that source's events, and goes on with the rest).
pub fn watch_all(
    ops: &mut EventOps,
    events: impl IntoIterator<Item = Events>,
    fails: &telemetry::Counter,
    device: &str,
) {
    for events in events {
        if let Err(e) = ops.add(events) {
            fails.inc();
            log::error!("{device}: cannot watch a descriptor: {e}");
        }
    }
}
