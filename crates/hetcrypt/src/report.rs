//! What a batch did: wall time, and per engine and lane the jobs, bytes and busy time.

use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::engine::EngineKind;

/// Serialises a duration as seconds (f64), the unit every table shows.
fn seconds<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// One lane's share of a batch.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LaneReport {
    /// The lane's index within its engine.
    pub lane: usize,
    /// Whether its thread ran in this batch (a policy may leave out the lanes of an
    /// engine it has no use for; they start only to take over a failed engine's jobs).
    pub started: bool,
    /// Jobs it completed (successfully or with a job error).
    pub jobs: usize,
    /// Input bytes of those jobs.
    pub bytes: u64,
    /// Time spent running jobs.
    #[serde(serialize_with = "seconds")]
    pub busy: Duration,
    /// CPU time its thread used over the batch (includes scheduling work).
    #[serde(serialize_with = "seconds")]
    pub cpu: Duration,
}

/// One engine's share of a batch.
#[derive(Clone, Debug, Serialize)]
pub struct EngineReport {
    /// The engine's name.
    pub name: String,
    /// Its kind.
    pub kind: EngineKind,
    /// Jobs it completed.
    pub jobs: usize,
    /// Input bytes of those jobs.
    pub bytes: u64,
    /// Sum of its lanes' busy time.
    #[serde(serialize_with = "seconds")]
    pub busy: Duration,
    /// Why it was quarantined, if it failed (in this batch or before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
    /// Per-lane detail.
    pub lanes: Vec<LaneReport>,
}

/// What a batch did.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The policy's name.
    pub policy: String,
    /// Jobs in the batch.
    pub jobs: usize,
    /// Input bytes in the batch.
    pub bytes: u64,
    /// From the lanes' start to their join (the seeds' measure).
    #[serde(serialize_with = "seconds")]
    pub wall: Duration,
    /// Per engine.
    pub engines: Vec<EngineReport>,
    /// Jobs taken back from a failed engine and run elsewhere.
    pub redispatched: usize,
    /// Jobs that ended in an error (bad input, authentication, no engine).
    pub job_errors: usize,
}

impl Report {
    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// The report of the engine named `name`.
    pub fn engine(&self, name: &str) -> Option<&EngineReport> {
        self.engines.iter().find(|e| e.name == name)
    }

    /// Throughput over the wall time, in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.bytes as f64 / secs
        } else {
            0.0
        }
    }
}
