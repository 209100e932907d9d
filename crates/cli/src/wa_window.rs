//! Write amplification over a recent window: the server samples the pool's counters every few
//! seconds and keeps the last ten minutes, so `flashpool status` reports what the pool does
//! now (media bytes written per host byte over the window), not an average since the start
//! that a burst long ago dominates, and nothing over a window without host writes.

use flashpool_engine::StatsSnapshot;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far back the window reaches.
pub const WINDOW: Duration = Duration::from_secs(600);

/// Samples of the pool's counters over the last `WINDOW`.
#[derive(Default)]
pub struct WaWindow {
    samples: Mutex<VecDeque<(Instant, StatsSnapshot)>>,
}

impl WaWindow {
    /// Records the counters as they are now and drops samples older than the window.
    pub fn sample(&self, now: StatsSnapshot) {
        let t = Instant::now();
        let mut s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        s.push_back((t, now));
        while s
            .front()
            .is_some_and(|(at, _)| t.duration_since(*at) > WINDOW)
        {
            s.pop_front();
        }
    }

    /// Write amplification between the oldest sample and `now`, by cause; None when the
    /// hosts wrote nothing in the window.
    pub fn json(&self, now: &StatsSnapshot) -> serde_json::Value {
        let s = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        let Some((at, old)) = s.front() else {
            return serde_json::Value::Null;
        };
        let host = now.host_write_bytes.saturating_sub(old.host_write_bytes);
        let media = (now.media_write_bytes()).saturating_sub(old.media_write_bytes());
        let moved = now
            .gc_relocated_bytes
            .saturating_sub(old.gc_relocated_bytes);
        if host == 0 {
            // No ratio, but what the drives were written all the same (the cleaner's moves,
            // checkpoints): traffic without host writes is what an operator must see.
            return serde_json::json!({"seconds": at.elapsed().as_secs(), "host_write_bytes": 0,
                "media_write_bytes": media, "gc_relocated_bytes": moved});
        }
        let d = |a: u64, b: u64| a.saturating_sub(b) as f64 / host as f64;
        serde_json::json!({
            "seconds": at.elapsed().as_secs(),
            "host_write_bytes": host,
            "media_write_bytes": media,
            "gc_relocated_bytes": moved,
            "total": media as f64 / host as f64,
            "gc": d(now.gc_relocated_bytes, old.gc_relocated_bytes),
            "parity": d(now.media_parity_bytes, old.media_parity_bytes),
            "metadata": d(now.media_metadata_bytes, old.media_metadata_bytes),
            "padding": d(now.media_padding_bytes, old.media_padding_bytes),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_ratios_and_no_host_writes() {
        let w = WaWindow::default();
        let a = StatsSnapshot {
            host_write_bytes: 100,
            media_data_bytes: 100,
            ..Default::default()
        };
        w.sample(a.clone());
        assert_eq!(w.json(&a)["host_write_bytes"], 0);
        assert!(w.json(&a)["total"].is_null());
        // No host writes, but the cleaner moved data: the drive traffic still shows.
        let idle = StatsSnapshot {
            gc_relocated_bytes: 4096,
            media_data_bytes: 100 + 4096,
            ..a.clone()
        };
        let j = w.json(&idle);
        assert!(j["total"].is_null());
        assert_eq!(j["media_write_bytes"], 4096, "{j}");
        assert_eq!(j["gc_relocated_bytes"], 4096, "{j}");
        let b = StatsSnapshot {
            host_write_bytes: 1100,
            media_data_bytes: 1100,
            media_parity_bytes: 250,
            ..Default::default()
        };
        let j = w.json(&b);
        assert_eq!(j["host_write_bytes"], 1000);
        assert!((j["total"].as_f64().unwrap() - 1.25).abs() < 1e-9, "{j}");
        assert!((j["parity"].as_f64().unwrap() - 0.25).abs() < 1e-9, "{j}");
    }
}
