//! What ember tells its operator: the human-readable log ([`logger`]) and the JSON metrics
//! ([`metrics`]), both written to a file or a named pipe through a [`sink::LineSink`] that
//! drops a line rather than wait for a slow reader.

pub mod counter;
pub mod latency;
pub mod logger;
pub mod metrics;
pub mod sink;
pub mod sparse;
pub mod time;

pub use counter::{Counter, MaxGauge};
pub use latency::{LatencyMetrics, Span, Timed};
pub use metrics::{
    ApiMetrics, BalloonMetrics, BlockMetrics, DeviceMetrics, EntropyMetrics, Metrics, NetMetrics,
    VcpuMetrics, VsockMetrics,
};
pub use sink::LineSink;
pub use sparse::Sparse;
