//! The fault suite: the worker under kill -9, a broker restart, a broker hang, nodes
//! of a three-node RabbitMQ cluster killed, a Redis outage, a Redis Sentinel
//! failover and a Redis Cluster master failing over to its replica, four competing
//! processes, SIGTERM under load, stale `x-death` headers, kill -9 while feedback
//! is applied, kill -9 while a campaign is parked, kill -9 while digests close and
//! a broker restart with digests open, kill -9 and a Sentinel failover while
//! stacked limits hold the jobs, one file a scenario over a shared harness
//! (`harness.rs`). Every scenario publishes a known set of jobs and ends with an
//! audit (see `testkit::audit`): each job id found exactly once as dispatched,
//! waiting or dead-lettered; caps checked against what was dispatched and what
//! Redis recorded; duplicates counted and explained. Figures go to
//! `target/reliability/*.json` and, with `QW_WRITE_RELIABILITY=1`, into
//! RELIABILITY.md.
//!
//! Quick form (CI): `cargo test --test faults`. Long form:
//! `QW_FAULTS_LONG=1 cargo test --release --test faults` (20,000 jobs and 20 kills,
//! a 30 s Redis outage, a 30 s broker hang, two broker restarts, the second a
//! SIGKILL, Sentinel and cluster failovers of 6,000 jobs a run). Scenarios run one at a time (they load the machine); `QW_FAULTS_SEED`
//! replays the random kill times; `QW_WORKER_LOG` sets the worker processes'
//! `RUST_LOG` (their logs are in the scenario's temp dir, kept with `QW_KEEP_TMP=1`).
//! Any panic in a worker process's log fails the scenario.
//! The soak (`soak.rs`, an hour of three workers with a fault every ten minutes) is
//! `#[ignore]`d: `bench/soak.sh` runs it.
//! The broker scenarios start their own RabbitMQ node (never the shared one) and are
//! skipped (and recorded as skipped) where `/usr/lib/rabbitmq/bin/rabbitmq-server`
//! is missing; the Redis outage starts its own `redis-server`.

mod harness;

mod broker_hang;
mod broker_restart;
mod campaign_kill;
mod digest_broker_restart;
mod digest_close_kill;
mod escalation_restart;
mod fair_kill;
mod feedback_kill;
mod four_workers;
mod interrupted_admission;
mod kill_9;
mod limits_kill;
mod limits_sentinel;
mod memory_alarm;
mod rabbit_cluster;
mod redis_cluster_failover;
mod redis_outage;
mod redis_reset;
mod redis_sentinel;
mod sigterm;
mod soak;
mod stale_x_death;
mod unconfirmed_dispatch;

/// The `quota-worker` binary cargo built for these tests.
const BIN: &str = env!("CARGO_BIN_EXE_quota-worker");
