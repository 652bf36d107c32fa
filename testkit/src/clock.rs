//! A wall clock set to another instant for the processes a test starts: a private
//! `redis-server` and the worker binary started with [`ShiftedClock::env`] both see
//! time from that instant on (their monotonic clocks untouched), so a test can run
//! the real services across a daylight-saving change or a midnight that is months
//! away. The shift is a small `LD_PRELOAD` library (`clock_shift.c`), built once
//! per test process with the machine's C compiler.

use std::path::PathBuf;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};

/// A wall clock shifted to start at a chosen instant.
#[derive(Debug, Clone, Copy)]
pub struct ShiftedClock {
    /// How far ahead (ms) of the real clock it runs.
    pub shift_ms: i64,
}

impl ShiftedClock {
    /// A clock that reads `at` now (and moves on from there).
    pub fn at(at: DateTime<Utc>) -> ShiftedClock {
        ShiftedClock {
            shift_ms: (at - Utc::now()).num_milliseconds(),
        }
    }

    /// What it reads now.
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + chrono::Duration::milliseconds(self.shift_ms)
    }

    /// The environment that gives a process this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("LD_PRELOAD".into(), library().display().to_string()),
            ("QW_CLOCK_SHIFT_MS".into(), self.shift_ms.to_string()),
        ]
    }
}

/// The shim, compiled once per test process.
fn library() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let dir = crate::temp_dir("clock-shift");
        let src = dir.join("clock_shift.c");
        std::fs::write(&src, include_str!("clock_shift.c")).unwrap();
        let lib = dir.join("libqwclock.so");
        let out = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(&src)
            .output()
            .expect("cc (the C compiler) to build the shifted clock");
        assert!(
            out.status.success(),
            "building the shifted clock: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lib
    })
}
