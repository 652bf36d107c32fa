//! Least privilege on the broker (deploy/README.md, "RabbitMQ users"): users made
//! with the documented permissions, under unique names on the test's namespace,
//! deleted after. A producer publishes jobs and nothing else; a sender reads the
//! dispatch queues and publishes feedback and nothing else; the worker declares
//! its topology and consumes with its own.

use std::process::Command;
use std::time::Duration;

use lapin::options::BasicGetOptions;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use quota_worker::amqp::Publisher;
use testkit::*;

/// The documented permissions (configure, write, read) of each role, for the
/// names under `ns` (`notify` in deploy/README.md).
fn permissions(role: &str, ns: &str) -> [String; 3] {
    let n = ns.replace('.', "\\.").replace('-', "\\-");
    let p = |c: &str, w: &str, r: &str| {
        [
            c.replace("NS", &n),
            w.replace("NS", &n),
            r.replace("NS", &n),
        ]
    };
    match role {
        "producer" => p("^$", "^NS\\.jobs$", "^$"),
        "sender" => p("^$", "^NS\\.feedback$", "^NS\\.dispatch\\..+$"),
        "worker" => p("^NS\\..+$", "^(NS\\..+|amq\\.default)$", "^NS\\..+$"),
        _ => p("^$", "^NS\\.(jobs|dead)$", "^NS\\..+$"),
    }
}

/// RabbitMQ users that are deleted when dropped.
struct Users(Vec<String>);

impl Drop for Users {
    fn drop(&mut self) {
        for u in &self.0 {
            let _ = Command::new("rabbitmqctl")
                .args(["delete_user", u])
                .output();
        }
    }
}

fn ctl(args: &[&str]) {
    let out = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl");
    assert!(out.status.success(), "rabbitmqctl {args:?}: {out:?}");
}

async fn connect(user: &str) -> Connection {
    let url = amqp_url().replacen("guest:guest", &format!("{user}:pw-{user}"), 1);
    Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("the user connects")
}

/// Whether a publish to `exchange` as `conn`'s user is confirmed.
async fn can_publish(conn: &Connection, exchange: &str) -> bool {
    let Ok(p) = Publisher::open(conn, Duration::from_secs(5)).await else {
        return false;
    };
    p.publish(exchange, "sms", b"{}", BasicProperties::default())
        .await
        .is_ok()
}

/// Whether `conn`'s user may read `queue`.
async fn can_read(conn: &Connection, queue: &str) -> bool {
    let ch = conn.create_channel().await.unwrap();
    ch.basic_get(queue.into(), BasicGetOptions { no_ack: false })
        .await
        .is_ok()
}

#[tokio::test]
async fn each_role_does_its_part_and_nothing_else() {
    if Command::new("rabbitmqctl")
        .arg("status")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        eprintln!("SKIPPED: rabbitmqctl cannot reach the broker");
        return;
    }
    let ns = unique("priv");
    let s = settings(&ns);
    let (_c, _w, admin) = rig(&s).await;
    let mut users = Users(Vec::new());
    for role in ["producer", "sender", "worker", "operator"] {
        let user = format!("{ns}-{role}");
        ctl(&["add_user", &user, &format!("pw-{user}")]);
        users.0.push(user.clone());
        let [c, w, r] = permissions(role, &ns);
        ctl(&["set_permissions", "-p", "/", &user, &c, &w, &r]);
    }
    let dispatch = format!("{ns}.dispatch.sms");

    let producer = connect(&format!("{ns}-producer")).await;
    assert!(
        can_publish(&producer, &s.amqp.jobs_exchange).await,
        "a producer publishes jobs"
    );
    assert!(
        !can_read(&producer, &dispatch).await,
        "a producer cannot read a dispatch queue"
    );
    assert!(
        !can_publish(&producer, &s.feedback.exchange).await,
        "a producer cannot publish feedback"
    );

    let sender = connect(&format!("{ns}-sender")).await;
    assert!(
        can_read(&sender, &dispatch).await,
        "a sender reads its dispatch queue"
    );
    assert!(
        can_publish(&sender, &s.feedback.exchange).await,
        "a sender publishes feedback"
    );
    assert!(
        !can_publish(&sender, &s.amqp.jobs_exchange).await,
        "a sender cannot publish jobs"
    );
    assert!(
        !can_read(&sender, &s.amqp.jobs_queue).await,
        "a sender cannot read the jobs"
    );

    let worker = connect(&format!("{ns}-worker")).await;
    topology(&s)
        .declare(&worker)
        .await
        .expect("the worker declares its topology");
    assert!(can_read(&worker, &s.feedback.queue).await);
    assert!(can_read(&worker, &s.amqp.jobs_queue).await);
    // a delay, a lane and the dead-letter log's marker go through the default
    // exchange, straight to their queue
    let p = Publisher::open(&worker, Duration::from_secs(5))
        .await
        .unwrap();
    let through_default = p.publish("", &s.amqp.jobs_queue, b"{}", BasicProperties::default());
    assert!(
        through_default.await.is_ok(),
        "the worker publishes to its queues through the default exchange"
    );

    let operator = connect(&format!("{ns}-operator")).await;
    assert!(
        can_read(&operator, &s.amqp.dead_queue).await,
        "an operator reads dead letters"
    );
    assert!(
        can_publish(&operator, &s.amqp.jobs_exchange).await,
        "an operator replays them"
    );
    assert!(!can_publish(&operator, &s.feedback.exchange).await);
    for c in [producer, sender, worker, operator, admin] {
        let _ = c.close(200, "".into()).await;
    }
}
