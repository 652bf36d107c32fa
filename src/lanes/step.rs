//! Which lane a job is in ([`lane_of`]), and how a job of a paced channel takes its
//! channel's rate ([`before_slot`]): a job read from the jobs queue asks the rate
//! as any job does, in its lane, unless this worker's lanes hold a backlog (then it
//! is parked behind them without asking); a job read from a lane queue first waits
//! for its send slot in its lane's line. Pure: no I/O.

use super::share::{LaneAsk, Priority};
use crate::admission::RateStep;
use crate::amqp::Topology;
use crate::job::decode::Job;
use crate::quota::policy::Policy;

/// Where a job's rate step leads.
pub(crate) enum Step {
    /// Ask the store with this step.
    Admit(RateStep),
    /// Park it now (this worker's jobs of the channel already wait for the rate).
    Park(Priority),
}

/// The lane of a job: the lane queue it was read from, else its `priority`, else
/// its policy's.
pub(crate) fn lane_of(job: &Job<'_>, policy: &Policy, from: Option<Priority>) -> Priority {
    from.or(job.priority).unwrap_or(policy.priority)
}

/// The step of a job of `channel`, a paced channel whose lanes share its rate as
/// `ask` says, read from the queue of lane `from` (`None`: the jobs queue), decided
/// before any wait: `None` when the job waits for its send slot in its lane's line
/// first (it was read from a lane queue). `backlog`: whether this worker's lanes
/// of the channel hold a backlog (asked only of a job read from the jobs queue).
pub(crate) fn before_slot(
    topology: &Topology,
    channel: &str,
    ask: LaneAsk,
    from: Option<Priority>,
    backlog: impl FnOnce() -> bool,
) -> Option<Step> {
    if !topology.has_lanes(channel) {
        // paced since a reload: no lane queue to park in; it waits here, in its lane
        return Some(Step::Admit(RateStep::Wait(Some(ask))));
    }
    if from.is_some() {
        return None;
    }
    Some(if backlog() {
        Step::Park(ask.lane)
    } else {
        Step::Admit(RateStep::Park(Some(ask)))
    })
}
