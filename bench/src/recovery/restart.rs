//! A broker restart as the recovery step's drain saw it (pure data, shared by the
//! watch that times it and the summary that counts around it).

/// A broker restart as the drain saw it, in seconds since the drain was first read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Restart {
    /// The broker asked to stop.
    pub asked: f64,
    /// The last answer before it went away (the workers dispatch while it stops).
    pub gone: f64,
    /// Its dispatch queue's first answer after its start, holding at least what it
    /// held before the stop.
    pub answered: f64,
    /// The lane queue with the backlog serving a consumer again (`None`: not seen).
    pub serving: Option<f64>,
}

impl Restart {
    /// Its end for the drain: the lane queue serving again, or the first answer if
    /// that came later (or the serving was not seen).
    pub fn back(&self) -> f64 {
        self.serving.map_or(self.answered, |s| s.max(self.answered))
    }
}
