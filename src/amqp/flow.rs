//! The broker's flow control: `connection.blocked` (a memory or disk alarm: the
//! broker reads none of the connection's publishes until `connection.unblocked`)
//! as a watch the session reads, so that it takes no new delivery while its
//! outcomes could not be published. Logged, and told to the caller's `report` (the
//! session shows it as `quota_worker_broker_blocked`).

use futures_util::StreamExt;
use lapin::Event;
use tokio::sync::watch;

/// Follow `conn`'s events into a watch: true while the broker blocks the
/// connection (starting from what the connection knows already). A connection
/// error or the end of the events says false (the session then sees the
/// connection's failure itself). Each change is also told to `report`.
pub fn follow(
    conn: &lapin::Connection,
    report: fn(bool),
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let events = conn.events_listener();
    let (tx, rx) = watch::channel(conn.status().blocked());
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            match event {
                Event::ConnectionBlocked(reason) => {
                    tracing::warn!(%reason, "the broker blocked the connection (flow control): no new jobs are taken, and the outcomes sent wait for their confirms");
                    report(true);
                    tx.send_replace(true);
                }
                Event::ConnectionUnblocked => {
                    tracing::info!("the broker unblocked the connection: taking jobs again");
                    report(false);
                    tx.send_replace(false);
                }
                Event::Error(_) => {
                    report(false);
                    tx.send_replace(false);
                }
                _ => {}
            }
        }
        tx.send_replace(false);
        // keep the sender until the session drops this task: a watch whose sender
        // is gone would wake its reader at once, again and again
        std::future::pending::<()>().await;
    });
    (rx, task)
}
