//! Prometheus metrics of the plugin: tiles total, healthy and allocated, and the Allocate latency.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// The plugin's metrics and the registry that exposes them.
pub struct PluginMetrics {
    registry: Registry,
    pub tiles_total: Gauge,
    pub tiles_healthy: Gauge,
    pub tiles_allocated: Gauge,
    pub allocate_seconds: Histogram,
}

impl Default for PluginMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl PluginMetrics {
    pub fn new() -> PluginMetrics {
        let mut registry = Registry::with_prefix("rdu");
        let tiles_total = Gauge::default();
        let tiles_healthy = Gauge::default();
        let tiles_allocated = Gauge::default();
        // 10 µs .. ~1.3 s
        let allocate_seconds = Histogram::new(exponential_buckets(1e-5, 2.0, 18));
        registry.register("tiles", "Tiles of the simulated node", tiles_total.clone());
        registry.register(
            "tiles_healthy",
            "Tiles currently healthy",
            tiles_healthy.clone(),
        );
        registry.register(
            "tiles_allocated",
            "Tiles currently allocated to containers",
            tiles_allocated.clone(),
        );
        registry.register(
            "allocate_seconds",
            "Time to serve one Allocate container request",
            allocate_seconds.clone(),
        );
        PluginMetrics {
            registry,
            tiles_total,
            tiles_healthy,
            tiles_allocated,
            allocate_seconds,
        }
    }

    pub fn observe_allocate(&self, elapsed: Duration) {
        self.allocate_seconds.observe(elapsed.as_secs_f64());
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposes_gauges_and_histogram() {
        let m = PluginMetrics::new();
        m.tiles_total.set(32);
        m.tiles_allocated.set(4);
        m.observe_allocate(Duration::from_micros(50));
        let text = m.encode();
        assert!(text.contains("rdu_tiles 32"), "{text}");
        assert!(text.contains("rdu_tiles_allocated 4"), "{text}");
        assert!(text.contains("rdu_allocate_seconds_count 1"), "{text}");
    }
}
