//! Writes the metrics: a JSON line every [`PERIOD`] once `PUT /metrics` (or `--metrics-path`)
//! names a destination, on each `FlushMetrics`, and when ember exits. The destination is a
//! [`LineSink`], so a full or absent reader costs a dropped (and counted) line, never a wait.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use event_manager::{EventOps, Events, MutEventSubscriber};
use telemetry::{LineSink, Metrics};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::timerfd::TimerFd;

/// How often metrics are written without being asked, as in Firecracker.
pub const PERIOD: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Reinitialization of metrics not allowed: they already go to {0}")]
    Again(String),
    #[error("Cannot initialize the metrics: cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot create the metrics timer: {0}")]
    Timer(#[source] std::io::Error),
}

#[derive(Debug)]
pub struct MetricsWriter {
    metrics: Arc<Metrics>,
    /// The destination and its path, once configured.
    sink: Option<(String, LineSink)>,
    timer: TimerFd,
}

impl MetricsWriter {
    pub fn new(metrics: Arc<Metrics>) -> Result<Self, Error> {
        Ok(MetricsWriter {
            metrics,
            sink: None,
            timer: TimerFd::new().map_err(|e| Error::Timer(e.into()))?,
        })
    }

    /// Sets the destination, once per process as in Firecracker, and starts the periodic
    /// writes.
    pub fn configure(&mut self, path: &str) -> Result<(), Error> {
        if let Some((current, _)) = &self.sink {
            return Err(Error::Again(current.clone()));
        }
        let sink = LineSink::open(Path::new(path)).map_err(|source| Error::Open {
            path: path.to_string(),
            source,
        })?;
        self.timer
            .reset(PERIOD, Some(PERIOD))
            .map_err(|e| Error::Timer(e.into()))?;
        self.sink = Some((path.to_string(), sink));
        Ok(())
    }

    /// Writes one line, if there is a destination.
    pub fn flush(&mut self) {
        let Some((_, sink)) = &mut self.sink else {
            return;
        };
        if !sink.write_line(self.metrics.line().as_bytes()) {
            self.metrics.missed_lines.inc();
        }
    }
}

impl MutEventSubscriber for MetricsWriter {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.timer, EventSet::IN)) {
            log::error!("cannot watch the metrics timer: {e}");
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.fd() == self.timer.as_raw_fd() {
            let _ = self.timer.wait();
            self.flush();
        }
    }
}
