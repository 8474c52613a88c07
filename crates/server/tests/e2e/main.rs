//! End-to-end tests of `starling serve`: one test binary, so the harness
//! in `common.rs` is shared without per-file dead code.

mod access;
mod bench;
mod common;
mod hardening;
mod interest;
mod lifecycle;
mod nats;
mod run;
mod serve;
