//! What the Redis side could not do: one error type for every call to Redis.

/// What the store could not do.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis is unreachable or answered with an error: the world is broken, not the job.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A batched admission call failed as a whole (the first job of the batch got
    /// the original error).
    #[error("redis (batched admission): {0}")]
    Batch(String),
    /// An admission was recorded on the master (or found reserved there) but fewer
    /// replicas than `redis.wait_replicas` acknowledged it within
    /// `redis.wait_timeout`: the job is held and retried (a reservation this call
    /// recorded, at `reserved_at` ms, is taken back then), so a failover cannot
    /// forget a send that was dispatched.
    #[error("redis: admission acknowledged by {acked} of {wanted} replicas in time")]
    Unreplicated {
        /// When the reservation was recorded (ms, Redis time).
        reserved_at: i64,
        /// Whether this call recorded it; else it found a live reservation there
        /// (this worker's from an earlier try, or another worker's), which must not
        /// be taken for a replicated one.
        recorded: bool,
        /// Replicas that acknowledged.
        acked: i64,
        /// `redis.wait_replicas`.
        wanted: u32,
    },
    /// A script answered something it never should.
    #[error("unexpected reply from {script}: {reply:?}")]
    Reply {
        /// Which script.
        script: &'static str,
        /// What it said.
        reply: Vec<i64>,
    },
    /// A script answered, by name, something the worker cannot act on (a value no
    /// worker writes, or still outside the planned day after planning again).
    #[error("unexpected answer from {script}: {answer}")]
    Answer {
        /// Which script.
        script: &'static str,
        /// The answer, by name.
        answer: String,
    },
    /// The job names a channel that is not configured.
    #[error("unknown channel `{0}`")]
    UnknownChannel(String),
    /// TLS cannot be set up as configured.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// A cost the channel's burst can never allow.
    #[error("a cost of {cost} can never pass channel `{channel}`'s burst of {burst}")]
    CostAboveBurst {
        /// The channel the job names.
        channel: String,
        /// The job's cost in tokens.
        cost: u64,
        /// The most tokens the channel's bucket ever holds.
        burst: u64,
    },
}

impl StoreError {
    /// Whether waiting cannot help: TLS that cannot be set up, or Redis refusing
    /// the credentials in the URL.
    pub fn is_fatal(&self) -> bool {
        match self {
            StoreError::Tls(_) => true,
            StoreError::Redis(e) => e.kind() == redis::ErrorKind::AuthenticationFailed,
            _ => false,
        }
    }
}
