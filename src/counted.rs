//! One more in a count for as long as a guard lives ([`Counted`]): the counts of
//! jobs waiting for a channel's rate (the store's pacing, the lanes' backlog).
//! Pure: no I/O.

use std::sync::atomic::{AtomicUsize, Ordering};

/// One more in a count for as long as it lives: a wait given up (a shutdown, a job
/// parked after all) leaves the count as it found it.
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    /// Count one more in `count` until the guard is dropped.
    pub(crate) fn new(count: &'a AtomicUsize) -> Counted<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
