//! The operators' console: `/console` on `http.listen`, served by the worker
//! itself, as server-rendered HTML (maud: escaped by default, no JavaScript).
//! Six pages, each a file: the overview (what the status page shows, from the same
//! [`crate::status::Report`]), a recipient (its layers in each waiting job's zone,
//! preferences, suppressions, waiting jobs and digests), a job (its note as a
//! timeline), the waiting jobs and the recipients they hold (found by a bounded
//! `SCAN`), the dead letters (read
//! from their index in Redis, [`crate::admin::dead_index`], never from the queue,
//! caught up when a page is read from the stream the broker copies every dead
//! letter to, [`crate::admin::dead_log`]) and the policies with the tenants'
//! overrides. Every instant is written one way ([`layout::when`]: UTC, and the
//! viewer's zone beside it, from the `qw_tz` cookie). Every action calls the same
//! library functions as the CLI and the REST API ([`crate::admin`]).
//!
//! Access ([`session`], [`login`]): where `POST /reload` needs an admin token,
//! every page does too: a login form, itself guarded against posts from elsewhere,
//! turns any admin token into a session cookie (`HttpOnly`, `SameSite=Strict`,
//! `Secure` behind TLS), named after the token, that expires after
//! `console.session_ttl`; every form carries the session's CSRF token; each action
//! is logged with who and what. I/O: Redis through the store, the broker for replays and purges.

use std::sync::Arc;

use axum::routing::{get, post};
use axum::Router;

use crate::health::Health;
use crate::http::guard::Guard;
use crate::status::Status;

mod dead;
mod fields;
mod job;
mod layout;
mod login;
mod overview;
mod policies;
mod recipient;
mod session;
mod waiting;

pub use login::LOGIN_COOKIE;
pub use session::{Session, COOKIE};

/// What the console serves from: the worker's status (with the reloader, hence
/// the store and the settings, once connected), its health, the guard of the
/// admin token; the key of its login forms and the broker connection its
/// catch-ups, replays and purges use (opened on the first one). Its sessions are
/// in Redis ([`session`]).
pub struct Console {
    status: Arc<Status>,
    health: Arc<Health>,
    guard: Guard,
    /// The key of the login forms' pre-session tokens: drawn from the admin
    /// tokens, so that every worker behind one address takes the forms of the
    /// others (drawn at random when there is no token to log in with).
    login_key: [u8; 32],
    broker: dead::WalksBroker,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Console")
    }
}

impl Console {
    /// The console of the worker whose state is `status` and `health`, asking for
    /// `guard`'s token (the one `POST /reload` asks for).
    pub fn new(status: Arc<Status>, health: Arc<Health>, guard: Guard) -> Arc<Console> {
        let login_key = login_key(&guard);
        Arc::new(Console {
            status,
            health,
            guard,
            login_key,
            broker: dead::WalksBroker::default(),
        })
    }
}

/// The login forms' key: from the tokens' hashes (names included), else at random.
fn login_key(guard: &Guard) -> [u8; 32] {
    const CONTEXT: &str = "quota-worker 2026 console login forms";
    let material = match guard {
        Guard::Tokens(tokens) => {
            let mut sorted: Vec<_> = tokens.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            sorted
                .iter()
                .flat_map(|(name, hash)| [name.as_bytes(), b"\0", hash.as_bytes()].concat())
                .collect::<Vec<u8>>()
        }
        Guard::Open | Guard::Refused => [
            uuid::Uuid::new_v4().into_bytes(),
            uuid::Uuid::new_v4().into_bytes(),
        ]
        .concat(),
    };
    blake3::derive_key(CONTEXT, &material)
}

/// The routes under `/console`.
pub fn router(console: Arc<Console>) -> Router {
    Router::new()
        .route("/console", get(overview::show))
        .route("/console/login", get(login::form).post(login::login))
        .route("/console/logout", post(session::logout))
        .route("/console/zone", get(session::zone))
        .route("/console/waiting", get(waiting::show))
        .route("/console/recipient", get(recipient::show))
        .route(
            "/console/recipient/preferences",
            post(recipient::preferences),
        )
        .route("/console/recipient/unsuppress", post(recipient::unsuppress))
        .route("/console/digest/flush", post(recipient::flush))
        .route("/console/job", get(job::show))
        .route("/console/job/cancel", post(job::cancel))
        .route("/console/dead", get(dead::list))
        .route("/console/dead/one", get(dead::one))
        .route("/console/dead/confirm", post(dead::confirm))
        .route("/console/dead/apply", post(dead::apply))
        .route("/console/policies", get(policies::show))
        .route("/console/policies/reload", post(policies::reload))
        .with_state(console)
}
