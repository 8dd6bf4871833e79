//! The library's integration tests that run on the host only, in one test binary (libtest runs
//! them in parallel, and there is one link instead of one per file). The ones the testbed
//! guest runs (kat, differential, kernel_unavailable, devcrypto_unavailable, testbed_*)
//! stay binaries of their own: testbed/ci and guest-tests/suite.sh run them by name.

#[path = "../common/mod.rs"]
mod common;

mod adaptive_sampling;
mod batch_width;
mod deferred_lanes;
mod failover;
mod job_limits;
mod key_removal;
mod policies;
mod split;
