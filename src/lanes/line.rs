//! The line of a lane: the deliveries of one lane of one channel that wait in this
//! worker for a send slot (read from its lane queue, or from the jobs queue and
//! refused by the rate for a moment), served in order by one asker.
//!
//! Each delivery asking the rate on its own (and sleeping to its `retry_after` when
//! refused) makes a herd: every waiting delivery wakes at each slot, all of them
//! ask, one gets it, so a slot costs a wake-up and an ask per delivery held, and
//! the drain falls as the prefetch grows. Here the deliveries join their lane's
//! line, and one task (the line's asker, alive while the line is not empty) asks
//! `lua/lanes.lua` for as many slots as deliveries wait, taking the slots that
//! come due within its look-ahead, and hands them out first come, first served:
//! each delivery sleeps to its own slot's time. A slot costs one ask whatever the
//! prefetch; the lane still takes only what the channel's rate and the lanes above
//! it allow (the script decides, for every worker at once).
//!
//! The look-ahead covers the asker's own round trip. The script never grants a
//! slot whose time has passed (with a burst of 1 a slot nobody takes at its
//! instant is gone), so the slots between the last one an ask granted and the
//! moment the next ask reaches Redis are lost unless the first ask already took
//! them. The asker times each ask and looks ahead twice the longest recent round
//! trip ([`Ahead`]), at least [`LOOK_AHEAD`] (no wake-up lands exactly on a slot's
//! instant) and at most [`MAX_LOOK_AHEAD`]. On a Redis 40 ms away a fixed 10 ms
//! drained a lane at a fifth of its rate.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::fair::{self, MAX_CANDIDATES};
use super::share::LaneAsk;
use crate::quota::policy::Rate;
use crate::redis::lanes::{Candidate, Granted};
use crate::redis::{fail_all, StoreError};

/// Most slots one ask takes (the most deliveries a worker holds from a lane,
/// `lanes.prefetch`'s ceiling).
const MAX_ASK: usize = 1024;

/// Who asks the channel's rate for a line's slots (the channel's
/// [`Asker`](super::slots::Asker), through [`crate::redis::lanes::slots`]).
pub(crate) trait AskSlots: Send + Sync + 'static {
    /// The channel's name.
    fn channel(&self) -> &str;
    /// One ask: `wanted` slots of `rate` in `ask.lane`, those due within `ahead`;
    /// with more than one candidate, which of them each slot goes to (the lane's
    /// schedule decides, `lua/lanes.lua`).
    fn slots(
        &self,
        ask: (Rate, LaneAsk),
        wanted: usize,
        ahead: Duration,
        candidates: &[Candidate],
    ) -> impl Future<Output = Result<Granted, StoreError>> + Send;
}

/// Whose a delivery of a line is: its tenant (`None`: the jobs without one) and
/// the tenant's weight in force when it joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tenant {
    /// The tenant's name.
    pub name: Option<Arc<str>>,
    /// Its weight ([`crate::lanes::fair::stride`]).
    pub weight: u32,
}

#[cfg(test)]
impl Tenant {
    /// The jobs without a tenant.
    pub(crate) fn none() -> Tenant {
        Tenant {
            name: None,
            weight: 1,
        }
    }
}

/// The least the asker looks ahead of now for slots: well past a timer's lateness
/// (a millisecond, more on a loaded machine), short beside any wait that matters
/// to a higher lane.
pub(crate) const LOOK_AHEAD: Duration = Duration::from_millis(10);

/// The most the asker looks ahead: slots taken ahead are this lane's, so a job of
/// a higher lane may wait up to this long behind them (the same bound as a job's
/// wait in the worker before it is parked, `lanes.park_after`'s default). A Redis
/// slower than half of it a round trip loses slots again.
pub(crate) const MAX_LOOK_AHEAD: Duration = Duration::from_millis(250);

/// The asker's look-ahead, from the round trips of its asks: twice the longest
/// recent one (a longer round trip counts at once; a shorter one lowers the
/// estimate by an eighth of the difference an ask, so one fast answer after slow
/// ones does not shorten it to where the next slow one loses slots).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ahead {
    round_trip: Duration,
}

impl Ahead {
    /// An ask took `round_trip` from its sending to its answer.
    pub(crate) fn observe(&mut self, round_trip: Duration) {
        self.round_trip = if round_trip >= self.round_trip {
            round_trip
        } else {
            self.round_trip - (self.round_trip - round_trip) / 8
        };
    }

    /// How far ahead the next ask takes slots.
    pub(crate) fn now(&self) -> Duration {
        (self.round_trip * 2).clamp(LOOK_AHEAD, MAX_LOOK_AHEAD)
    }
}

/// A slot handed to a delivery of the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The TAT its take left (what a refund passes).
    pub tat_us: i64,
    /// How long until the slot is due (the delivery waits this long first).
    pub wait: Duration,
    /// Served by the first ask after it joined, and due at once: its lane holds no
    /// backlog here.
    pub at_once: bool,
}

type Reply = Result<Slot, StoreError>;

struct Waiter {
    ask: (Rate, LaneAsk),
    /// The asks begun before it joined.
    joined_after: u64,
    tx: oneshot::Sender<Reply>,
}

/// The waiters of one tenant, in order.
struct TenantLine {
    tenant: Tenant,
    waiters: VecDeque<Waiter>,
}

#[derive(Default)]
struct Line {
    /// One line per tenant with deliveries waiting, in the order they are
    /// presented to the schedule (turning when more than [`MAX_CANDIDATES`] wait).
    tenants: VecDeque<TenantLine>,
    /// Whether the asker runs.
    asking: bool,
    /// Asks begun so far.
    asks: u64,
    /// How far ahead its asks look (kept while the line is empty: the next asker
    /// starts from what the last one learnt).
    ahead: Ahead,
}

/// The lines of one channel: one per lane.
#[derive(Default)]
pub(crate) struct Lines([Arc<Mutex<Line>>; 3]);

impl Lines {
    /// Wait in `ask.lane`'s line for a slot of `rate`, as a job of `tenant`.
    pub(crate) async fn slot<A: AskSlots>(
        &self,
        taker: &Arc<A>,
        (rate, ask): (Rate, LaneAsk),
        tenant: Tenant,
    ) -> Reply {
        let line = &self.0[ask.lane.rank().min(2)];
        let (tx, rx) = oneshot::channel();
        {
            let mut l = line.lock().unwrap_or_else(|e| e.into_inner());
            let joined_after = l.asks;
            let waiter = Waiter {
                ask: (rate, ask),
                joined_after,
                tx,
            };
            match l.tenants.iter_mut().find(|t| t.tenant.name == tenant.name) {
                Some(t) => {
                    // a reload may have changed the weight
                    t.tenant.weight = tenant.weight;
                    t.waiters.push_back(waiter)
                }
                None => l.tenants.push_back(TenantLine {
                    tenant,
                    waiters: VecDeque::from([waiter]),
                }),
            }
            if !l.asking {
                l.asking = true;
                tokio::spawn(serve(taker.clone(), line.clone()));
            }
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Batch("the lane's asker stopped".into())))
    }

    /// How far ahead the lines look now (the farthest of the three): how long a
    /// delivery may wait in a line for a slot already its own.
    pub(crate) fn ahead(&self) -> Duration {
        self.0
            .iter()
            .map(|l| l.lock().unwrap_or_else(|e| e.into_inner()).ahead.now())
            .max()
            .unwrap_or(LOOK_AHEAD)
    }
}

/// The longest the asker sleeps after a refusal before it asks again: a reload may
/// bring a faster rate meanwhile, and deliveries that join wait for this asker.
const MAX_NOT_YET: Duration = Duration::from_secs(1);

/// The asker's mark on its line: whatever ends the asker (its return, a panic, its
/// task dropped with the runtime), the line is left without one, so the next
/// delivery that joins starts another instead of waiting for good.
struct Asking {
    line: Arc<Mutex<Line>>,
    /// Set when the asker leaves an empty line (it cleared `asking` itself, under
    /// the same lock that found the line empty).
    done: bool,
}

impl Drop for Asking {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut l = self.line.lock().unwrap_or_else(|e| e.into_inner());
        l.asking = false;
        // those waiting now would wait for an asker that is gone: their senders
        // dropped, they hear "the lane's asker stopped" ([`Lines::slot`]) and retry
        // as after any Redis error (each joins again and starts one)
        l.tenants.clear();
    }
}

/// The asker: while deliveries wait, ask for as many slots as the first of them
/// (of one rate: a reload may change it) and hand them out in order.
async fn serve<A: AskSlots>(taker: Arc<A>, line: Arc<Mutex<Line>>) {
    let mut asking = Asking {
        line: line.clone(),
        done: false,
    };
    loop {
        let Some(next) = next_ask(&line) else {
            asking.done = true;
            return;
        };
        let sent = Instant::now();
        let candidates = next.candidates();
        let answer = taker
            .slots(next.ask, next.wanted, next.ahead, &candidates)
            .await;
        let ahead = {
            let mut l = lock(&line);
            l.ahead.observe(sent.elapsed());
            l.ahead.now()
        };
        if ahead != next.ahead || next.number == 1 {
            crate::metrics::lane_look_ahead(taker.channel(), next.ask.1.lane.as_str(), ahead);
        }
        match answer {
            // each waiter retries as after any Redis error (its own backoff)
            Err(e) => fail_all(e, take_first(&line, &next.of)),
            Ok(Granted::Slots(slots, picks)) => hand_out(&line, (slots, picks), &next),
            Ok(Granted::NotYet(retry)) => {
                let nap = retry.clamp(Duration::from_micros(100), MAX_NOT_YET);
                tokio::time::sleep(nap).await
            }
            Ok(Granted::Never) => {
                let (rate, _) = next.ask;
                for tx in take_first(&line, &next.of) {
                    let _ = tx.send(Err(StoreError::CostAboveBurst {
                        channel: taker.channel().to_string(),
                        cost: rate.cost,
                        burst: rate.burst,
                    }));
                }
            }
        }
    }
}

/// The line, locked (a panic while it was held does not poison it for good).
fn lock(line: &Mutex<Line>) -> std::sync::MutexGuard<'_, Line> {
    line.lock().unwrap_or_else(|e| e.into_inner())
}

/// The asker's next ask: for the first waiter's rate and lane, as many slots as
/// the waiters of the same ask of the first [`MAX_CANDIDATES`] tenants (at most
/// [`MAX_ASK`]).
struct NextAsk {
    ask: (Rate, LaneAsk),
    wanted: usize,
    /// Its number among the line's asks.
    number: u64,
    /// How far ahead it looks.
    ahead: Duration,
    /// The tenants it asks for, with how many of their waiters each.
    of: Vec<(Tenant, usize)>,
}

impl NextAsk {
    /// The tenants presented to the schedule (even one alone: it may be ahead of
    /// a tenant waiting in another worker's line).
    fn candidates(&self) -> Vec<Candidate> {
        self.of
            .iter()
            .map(|(t, waiting)| Candidate {
                member: fair::member(t.name.as_deref()),
                stride: fair::stride(t.weight),
                waiting: *waiting,
            })
            .collect()
    }
}

/// The next ask, counted as begun; `None` when no waiter is left, the line then
/// marked without an asker (under the same lock that found it empty).
fn next_ask(line: &Mutex<Line>) -> Option<NextAsk> {
    let mut l = lock(line);
    // waiters that gave up (a shutdown) leave the line here
    for t in l.tenants.iter_mut() {
        t.waiters.retain(|w| !w.tx.is_closed());
    }
    l.tenants.retain(|t| !t.waiters.is_empty());
    let Some(first) = l.tenants.front().and_then(|t| t.waiters.front()) else {
        l.asking = false;
        return None;
    };
    let ask = first.ask;
    let mut of = Vec::new();
    let mut wanted = 0;
    for t in l.tenants.iter() {
        if of.len() == MAX_CANDIDATES || wanted == MAX_ASK {
            break;
        }
        let n = t
            .waiters
            .iter()
            .take(MAX_ASK - wanted)
            .take_while(|w| w.ask == ask)
            .count();
        if n > 0 {
            of.push((t.tenant.clone(), n));
            wanted += n;
        }
    }
    if l.tenants.len() > of.len() {
        // more tenants wait than one ask presents: the next ask presents the others
        // first
        let n = of.len();
        l.tenants.rotate_left(n);
    }
    l.asks += 1;
    Some(NextAsk {
        ask,
        wanted,
        number: l.asks,
        ahead: l.ahead.now(),
        of,
    })
}

/// The waiters an ask was for, out of the line.
fn take_first(line: &Mutex<Line>, of: &[(Tenant, usize)]) -> Vec<oneshot::Sender<Reply>> {
    let mut l = lock(line);
    let mut out = Vec::new();
    for (tenant, n) in of {
        if let Some(t) = l.tenants.iter_mut().find(|t| t.tenant.name == tenant.name) {
            let n = (*n).min(t.waiters.len());
            out.extend(t.waiters.drain(..n).map(|w| w.tx));
        }
    }
    l.tenants.retain(|t| !t.waiters.is_empty());
    out
}

/// Hand the slots of an ask to the waiters: each to the first waiter of the tenant
/// the schedule picked (one tenant: in order); a tenant with none left (gone
/// meanwhile) passes its slot to the next tenant of the ask that has one (none
/// left: the slot goes unused, the rate is never exceeded).
fn hand_out(line: &Mutex<Line>, (slots, picks): (Vec<(i64, Duration)>, Vec<usize>), ask: &NextAsk) {
    let mut l = lock(line);
    for (i, (tat_us, wait)) in slots.into_iter().enumerate() {
        let pick = picks
            .get(i)
            .copied()
            .unwrap_or(0)
            .min(ask.of.len().saturating_sub(1));
        let order = std::iter::once(pick).chain((0..ask.of.len()).filter(|c| *c != pick));
        'slot: for c in order {
            let Some((tenant, _)) = ask.of.get(c) else {
                continue;
            };
            let Some(t) = l.tenants.iter_mut().find(|t| t.tenant.name == tenant.name) else {
                continue;
            };
            while let Some(w) = t.waiters.pop_front() {
                let at_once = w.joined_after + 1 == ask.number && wait.is_zero();
                let slot = Slot {
                    tat_us,
                    wait,
                    at_once,
                };
                if w.tx.send(Ok(slot)).is_ok() {
                    break 'slot;
                }
            }
        }
    }
    l.tenants.retain(|t| !t.waiters.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lanes::share::{LaneRate, Priority};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Asks as told: `first` for the first ask, every slot asked for after it.
    struct Scripted {
        asks: AtomicU32,
        first: fn() -> Granted,
    }

    impl AskSlots for Scripted {
        fn channel(&self) -> &str {
            "sms"
        }

        async fn slots(
            &self,
            _ask: (Rate, LaneAsk),
            wanted: usize,
            _ahead: Duration,
            _candidates: &[Candidate],
        ) -> Result<Granted, StoreError> {
            if self.asks.fetch_add(1, Ordering::SeqCst) == 0 {
                return Ok((self.first)());
            }
            Ok(Granted::Slots(
                (0..wanted).map(|i| (i as i64, Duration::ZERO)).collect(),
                vec![],
            ))
        }
    }

    /// A line's asker that answers `first` to its first ask, with a rate of one
    /// slot at a time and a job of the normal lane asking.
    struct OneSlot {
        taker: Arc<Scripted>,
        rate: Rate,
        ask: LaneAsk,
    }

    fn one_slot(first: fn() -> Granted) -> OneSlot {
        let taker = Arc::new(Scripted {
            asks: AtomicU32::new(0),
            first,
        });
        let rate = Rate {
            interval_us: 10_000,
            burst: 1,
            cost: 1,
        };
        let ask = LaneAsk {
            lane: Priority::Normal,
            lanes: LaneRate {
                reserve_us: 0,
                share_interval_us: 0,
            },
        };
        OneSlot { taker, rate, ask }
    }

    #[tokio::test]
    async fn an_asker_that_panics_leaves_the_line_to_the_next_one() {
        let OneSlot { taker, rate, ask } = one_slot(|| panic!("a bug in the asker"));
        let lines = Lines::default();
        let within = Duration::from_secs(5);
        let first = tokio::time::timeout(within, lines.slot(&taker, (rate, ask), Tenant::none()))
            .await
            .expect("the waiting delivery hears that its asker is gone");
        assert!(matches!(first, Err(StoreError::Batch(_))), "{first:?}");
        let next = tokio::time::timeout(within, lines.slot(&taker, (rate, ask), Tenant::none()))
            .await
            .expect("the next delivery starts an asker of its own");
        assert!(next.is_ok(), "{next:?}");
    }

    #[tokio::test]
    async fn a_long_refusal_is_asked_again_within_a_second() {
        // a refusal for an hour (a slow rate since reloaded): asked again at most
        // MAX_NOT_YET later, and served then
        let OneSlot { taker, rate, ask } = one_slot(|| Granted::NotYet(Duration::from_secs(3600)));
        let lines = Lines::default();
        let slot = tokio::time::timeout(
            Duration::from_secs(5),
            lines.slot(&taker, (rate, ask), Tenant::none()),
        )
        .await
        .expect("asked again within MAX_NOT_YET");
        assert!(slot.is_ok(), "{slot:?}");
        assert_eq!(taker.asks.load(Ordering::SeqCst), 2);
    }

    /// A channel's rate in memory, as `lua/lanes.lua` grants it with a burst of 1
    /// (no slot before now; those due within the look-ahead), `latency` away each
    /// way.
    struct Distant {
        interval: Duration,
        latency: Duration,
        start: Instant,
        tat: Mutex<Duration>,
    }

    impl AskSlots for Distant {
        fn channel(&self) -> &str {
            "sms"
        }

        async fn slots(
            &self,
            _ask: (Rate, LaneAsk),
            wanted: usize,
            ahead: Duration,
            _candidates: &[Candidate],
        ) -> Result<Granted, StoreError> {
            tokio::time::sleep(self.latency).await;
            let now = self.start.elapsed();
            let reply = {
                let mut tat = self.tat.lock().unwrap();
                let first = (*tat).max(now);
                if first > now + ahead {
                    Granted::NotYet(first - now - ahead)
                } else {
                    let room =
                        ((now + ahead - first).as_micros() / self.interval.as_micros()) as usize;
                    let granted = wanted.min(room + 1);
                    *tat = first + self.interval * granted as u32;
                    Granted::Slots(
                        (0..granted)
                            .map(|i| {
                                let due = first + self.interval * i as u32;
                                (due.as_micros() as i64, due.saturating_sub(now))
                            })
                            .collect(),
                        vec![],
                    )
                }
            };
            tokio::time::sleep(self.latency).await;
            Ok(reply)
        }
    }

    /// The instants (from the start) at which a line of `waiting` deliveries was
    /// served, Redis `latency` away each way, at 400 slots a second.
    async fn served_through(latency: Duration, waiting: usize) -> Vec<Duration> {
        let OneSlot { rate, ask, .. } = one_slot(|| Granted::Never);
        let taker = Arc::new(Distant {
            interval: Duration::from_micros(2_500),
            latency,
            start: Instant::now(),
            tat: Mutex::new(Duration::ZERO),
        });
        let lines = Arc::new(Lines::default());
        let mut waiters = Vec::new();
        for _ in 0..waiting {
            let (lines, taker) = (lines.clone(), taker.clone());
            waiters.push(tokio::spawn(async move {
                let slot = lines
                    .slot(&taker, (rate, ask), Tenant::none())
                    .await
                    .unwrap();
                tokio::time::sleep(slot.wait).await;
                taker.start.elapsed()
            }));
        }
        let mut served = Vec::new();
        for w in waiters {
            served.push(w.await.unwrap());
        }
        served
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_takes_every_slot_of_a_distant_redis() {
        // 400/s: 800 slots from the first second to the third, once the asker has
        // timed its first ask; a line looking a fixed 10 ms ahead took 5 slots a
        // round trip (250 of them 20 ms away each way)
        let (from, to) = (Duration::from_secs(1), Duration::from_secs(3));
        for (latency, round_trip) in [(20, "40 ms"), (100, "200 ms")] {
            let at = served_through(Duration::from_millis(latency), 2_000).await;
            let n = at.iter().filter(|t| **t >= from && **t < to).count();
            assert!(
                n >= 792,
                "{n} of 800 slots taken through a {round_trip} round trip"
            );
            assert!(n <= 801, "{n} slots in 2 s: above the rate");
        }
    }

    /// Grants every slot asked for, each to the candidate of lowest pass (a
    /// schedule in memory, as `lua/lanes.lua` keeps it), and notes who asked.
    struct Strides {
        passes: Mutex<std::collections::HashMap<String, u64>>,
        presented: Mutex<Vec<usize>>,
    }

    impl AskSlots for Strides {
        fn channel(&self) -> &str {
            "sms"
        }

        async fn slots(
            &self,
            _ask: (Rate, LaneAsk),
            wanted: usize,
            _ahead: Duration,
            candidates: &[Candidate],
        ) -> Result<Granted, StoreError> {
            self.presented.lock().unwrap().push(candidates.len());
            let mut passes = self.passes.lock().unwrap();
            let mut left: Vec<usize> = candidates.iter().map(|c| c.waiting).collect();
            let mut picks = Vec::new();
            for _ in 0..wanted.min(4) {
                let best = (0..candidates.len())
                    .filter(|i| left[*i] > 0)
                    .min_by_key(|i| passes.get(&candidates[*i].member).copied().unwrap_or(0));
                let Some(best) = best else { break };
                *passes.entry(candidates[best].member.clone()).or_default() +=
                    candidates[best].stride;
                left[best] -= 1;
                picks.push(best);
            }
            let n = if candidates.is_empty() {
                wanted.min(4)
            } else {
                picks.len()
            };
            let slots = (0..n).map(|i| (i as i64, Duration::ZERO)).collect();
            Ok(Granted::Slots(slots, picks))
        }
    }

    #[tokio::test]
    async fn the_schedule_picks_whose_waiter_gets_each_slot() {
        let OneSlot { rate, ask, .. } = one_slot(|| Granted::Never);
        let taker = Arc::new(Strides {
            passes: Mutex::default(),
            presented: Mutex::default(),
        });
        let lines = Arc::new(Lines::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        // 12 of `a` (weight 1) joined first, then 12 of `b` (weight 2), all before
        // the asker's first ask (a test's runtime runs one task at a time)
        for (name, weight) in [("a", 1), ("b", 2)] {
            for _ in 0..12 {
                let (lines, taker, order) = (lines.clone(), taker.clone(), order.clone());
                let tenant = Tenant {
                    name: Some(Arc::from(name)),
                    weight,
                };
                waiting.push(tokio::spawn(async move {
                    lines.slot(&taker, (rate, ask), tenant).await.unwrap();
                    order.lock().unwrap().push(name);
                }));
            }
        }
        for w in waiting {
            w.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let first: Vec<&str> = order.iter().take(12).copied().collect();
        let b = first.iter().filter(|n| **n == "b").count();
        assert!(
            (7..=9).contains(&b),
            "b (weight 2) took {b} of the first 12: {order:?}"
        );
        assert_eq!(order.len(), 24, "every waiter served");
    }

    #[test]
    fn the_look_ahead_follows_the_longest_recent_round_trip() {
        let ms = Duration::from_millis;
        let mut a = Ahead::default();
        assert_eq!(a.now(), LOOK_AHEAD, "nothing measured: the least");
        a.observe(ms(2));
        assert_eq!(a.now(), LOOK_AHEAD, "a fast Redis: the least");
        a.observe(ms(40));
        assert_eq!(a.now(), ms(80), "a slow answer counts at once");
        a.observe(ms(8));
        assert_eq!(
            a.now(),
            ms(72),
            "a fast one lowers it by an eighth of the gap"
        );
        for _ in 0..100 {
            a.observe(ms(8));
        }
        let low = a.now();
        assert!(
            low >= ms(16) && low < ms(17),
            "fast answers bring it down: {low:?}"
        );
        a.observe(ms(900));
        assert_eq!(a.now(), MAX_LOOK_AHEAD, "never past the most");
    }
}
