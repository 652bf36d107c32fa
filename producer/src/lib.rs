//! # quota-worker-producer
//!
//! What a service needs to publish jobs to `quota-worker`, and nothing of the
//! worker itself (no Redis, no allocator, no HTTP server): the job contract as a
//! type ([`Job`], with its JSON Schema, [`schema`]), the worker's own decoder
//! ([`decode()`], so a job the worker would dead-letter as `malformed` is refused
//! before it leaves), and a [`Producer`] that publishes persistent,
//! `application/json`, `message_id` = id, mandatory, and waits for the broker's
//! confirm ([`publisher`]). A job that no queue receives (the topology is not
//! declared yet) comes back as an error, not a silent loss. A job that carries a
//! `priority` goes to the worker's lanes exchange (`notify.lanes` beside
//! `notify.jobs`, [`lanes_beside`]), so that a campaign published with it waits in
//! its lane and never in the jobs queue in front of urgent jobs.
//!
//! ```no_run
//! use quota_worker_producer::{Job, Producer};
//! use serde_json::json;
//!
//! # async fn example() -> Result<(), quota_worker_producer::ProducerError> {
//! let producer = Producer::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "notify.jobs").await?;
//! let job = Job::new("+8613800000000", "sms")
//!     .category("marketing")
//!     .timezone("Asia/Shanghai")
//!     .payload(json!({ "template": "spring-sale" }));
//! let id = producer.publish(&job).await?; // confirmed by the broker
//! println!("published {id}");
//! # Ok(())
//! # }
//! ```
//!
//! Senders tell the worker what became of a dispatched job with a [`Feedback`]
//! (published to `notify.feedback` by a [`FeedbackPublisher`]; see
//! docs/guide/feedback.md).
//!
//! With the feature `preferences-client`, `preferences::PreferencesClient` reads
//! and edits a recipient's own preferences through the worker's HTTP API.
//!
//! The worker depends on this crate for its decoder and its confirm-mode publisher,
//! so the two cannot drift apart.
#![warn(missing_docs)]

pub mod decode;
pub mod feedback;
mod job;
#[cfg(feature = "preferences-client")]
pub mod preferences;
pub mod priority;
mod producer;
pub mod publisher;
pub mod trace;

pub use decode::{decode, Malformed};
pub use feedback::{decode_feedback, feedback_schema, Event, Feedback, FeedbackPublisher};
pub use job::{schema, Job, JobId};
pub use priority::Priority;
pub use producer::{encode, lanes_beside, Producer, ProducerError, DEFAULT_MAX_BODY_BYTES};
