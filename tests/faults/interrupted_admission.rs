//! Fault scenario: an admission interrupted by Redis.

use std::sync::Arc;
use std::time::Duration;

use crate::harness::*;
use quota_worker::config::Dur;
use testkit::procs::{self};
use testkit::*;

/// Regression: a job whose admission Redis interrupted after its reservation was
/// recorded (here: while it waited for the channel's rate) used to find its own
/// reservation on retry, take it for another worker's, and wait out the whole
/// reservation lease (2 min by default) before being dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_interrupted_by_redis_takes_its_own_reservation_back() {
    use quota_worker::admission::{Admission, Request};
    use quota_worker::store::QuotaStore;
    let mut redis = procs::RedisServer::new(false);
    let ns = unique("orphan");
    let mut s = fault_settings(&ns, 1);
    s.channels.get_mut("sms").unwrap().burst = Some(1);
    s.redis.url = redis.url();
    s.redis.reservation_lease = Dur(Duration::from_secs(120));
    let e = Arc::new(QuotaStore::connect(&s).await.unwrap());
    let req = |id: &'static str, who: &'static str| Request {
        id,
        recipient: who,
        channel: "sms",
        category: "daily",
        tz: chrono_tz::Tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    };
    // the first job takes the channel's only token; the second is admitted by its
    // recipient's cap and then waits about a second for the rate
    assert!(matches!(
        e.admit(&req("a", "r1")).await.unwrap(),
        Admission::Admitted(_)
    ));
    let e2 = e.clone();
    let waiting = tokio::spawn(async move { e2.admit(&req("b", "r2")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.stop();
    assert!(
        waiting.await.unwrap().is_err(),
        "the admission fails with Redis gone"
    );
    redis.start().unwrap();
    // the retry of the same job on the same worker is admitted at once
    let retry = loop {
        match e.admit(&req("b", "r2")).await {
            Ok(a) => break a,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(matches!(retry, Admission::Admitted(_)), "{retry:?}");
    // and it still counts once for its recipient
    let key = e.keys().recipient("r2", "daily", None);
    let n: i64 = redis::cmd("ZCARD")
        .arg(&key)
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(n, 1);
    // another job of the same recipient is still refused by the 1-per-day cap
    assert!(matches!(
        e.admit(&req("c", "r2")).await.unwrap(),
        Admission::Refused { .. }
    ));
}
