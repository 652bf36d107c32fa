//! Fault scenario: a dispatch whose fate is unknown.

use crate::harness::*;
use testkit::*;

/// A dispatch whose fate is unknown keeps its recipient's slot: the same job on the
/// same worker gets its reservation back at once, another job of that recipient is
/// refused, and a second worker (another engine) waits out the lease.
#[tokio::test]
async fn an_unconfirmed_dispatch_keeps_its_slot() {
    use quota_worker::admission::{Admission, Request};
    use quota_worker::store::QuotaStore;
    let ns = unique("keep");
    let _g = RedisGuard(ns.clone());
    let s = fault_settings(&ns, 1000);
    let e = QuotaStore::connect(&s).await.unwrap();
    let other = QuotaStore::connect(&s).await.unwrap();
    let req = |id: &'static str| Request {
        id,
        recipient: "kept",
        channel: "sms",
        category: "daily",
        tz: chrono_tz::Tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    };
    let Admission::Admitted(ticket) = e.admit(&req("x")).await.unwrap() else {
        panic!("admitted")
    };
    e.keep_reservation(&ticket);
    assert!(matches!(
        other.admit(&req("x")).await.unwrap(),
        Admission::Reserved { .. }
    ));
    assert!(matches!(
        e.admit(&req("y")).await.unwrap(),
        Admission::Refused { .. }
    ));
    let Admission::Admitted(again) = e.admit(&req("x")).await.unwrap() else {
        panic!("the same worker takes its reservation back")
    };
    assert_eq!(again.admitted_at, ticket.admitted_at);
    e.commit(&again).await.unwrap();
    assert_eq!(e.admit(&req("x")).await.unwrap(), Admission::Duplicate);
}
