use std::sync::Arc;

use super::{command, AdmitArgs, Call, LayerArgs, PrefsArgs};
use crate::quota::plan::Plan;

fn plan(limit: u32) -> Arc<Plan> {
    Arc::new(Plan {
        valid_from_ms: 0,
        valid_until_ms: 1 << 50,
        calendar_expiry_ms: 0,
        rules: vec![(limit, -86_400_000)],
        shadow: false,
        suppressed_by: 3,
    })
}

fn job(key: &str, layers: usize, channel: bool, prefs: bool) -> AdmitArgs {
    AdmitArgs {
        key: key.to_string(),
        member: key.as_bytes().to_vec(),
        plan: plan(1),
        channel: channel.then(|| "sms".to_string()),
        prefs: prefs.then(|| PrefsArgs {
            words: ["c".into(), "sms".into(), "normal".into()],
            version: 0,
            until: 0,
        }),
        layers: (0..layers)
            .map(|i| LayerArgs {
                key: format!("{key}:cap{i}"),
                plan: plan(3),
                holds: true,
            })
            .collect(),
        limits: vec![],
    }
}

/// ARGV as the script sees it (1-based: index 0 is unused).
fn argv(cmd: &redis::Cmd) -> Vec<String> {
    let args: Vec<String> = cmd
        .args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        })
        .collect();
    let declared: usize = args[2].parse().unwrap();
    let mut out = vec![String::new()];
    out.extend_from_slice(&args[3 + declared..]);
    out
}

const CALL: Call<'static> = Call {
    sha: "sha",
    lease_ms: 120_000,
    dedupe_ms: 86_400_000,
    prefix_len: 7,
};

/// Each section starts exactly where the header says, and the call ends with the
/// last section.
#[test]
fn every_section_starts_where_the_header_says() {
    let (a, b, c) = (
        job("a", 0, true, true),
        job("b", 2, true, true),
        job("c", 1, true, true),
    );
    let (cmd, _) = command(&CALL, &[&a, &b, &c], 1);
    let argv = argv(&cmd);
    let at = |i: usize| argv[i].parse::<usize>().unwrap();
    // header: lease, dedupe, undeclared, plans, then the three sections' starts
    assert_eq!(&argv[1..5], ["120000", "86400000", "2", "2"]);
    assert_eq!(argv[at(5)], "2", "two jobs meet caps");
    assert_eq!(argv[at(5) + 1], "2", "the first of them is job 2");
    assert_eq!(argv[at(6)], "7", "the suppression section opens with L");
    assert_eq!(argv[at(6) + 1], "3", "plan 1's mask");
    assert_eq!(
        argv[at(6) + 3],
        "sms",
        "job 1's channel after the two masks"
    );
    assert_eq!(argv[at(7)], "7", "the preferences section opens with L");
    assert_eq!(argv[at(7) + 1..at(7) + 4], ["c", "sms", "normal"]);
    assert_eq!(
        argv.len() - 1,
        at(7) + 15,
        "five values for each of three jobs"
    );
}

/// A call without sections says so with zeros, and carries nothing after the keys.
#[test]
fn a_call_without_sections_ends_with_its_keys() {
    let (a, b) = (job("a", 0, false, false), job("b", 0, false, false));
    let argv = argv(&command(&CALL, &[&a, &b], 1).0);
    assert_eq!(&argv[5..8], ["0", "0", "0"]);
    assert_eq!(argv.last().unwrap(), "b", "the undeclared key last");
}

/// The limits section names each limit's interval, burst and a counter's end
/// once, then each of its distinct buckets once (key, the total its jobs would
/// take), then which jobs meet limits, and each of those jobs' cost and its
/// buckets' numbers, in one value.
#[test]
fn the_limits_section_sends_each_bucket_once() {
    let (a, b, c) = limited_jobs();
    let argv = argv(&command(&CALL, &[&a, &b, &c], 3).0);
    let at: usize = argv[8].parse().unwrap();
    let section: Vec<&str> = argv[at..].iter().map(String::as_str).collect();
    assert_eq!(
        section,
        [
            "1", // one group: interval, burst, end, buckets
            "1000",
            "5",
            "0",
            "3",
            "all",
            "4",
            "s:x",
            "1",
            "s:y",
            "3",
            "101",         // jobs 1 and 3 meet limits, job 2 none
            "1 1 2;3 1 3", // job 1: cost 1, buckets 1 and 2; job 3: cost 3, 1 and 3
        ]
    );
}

/// Jobs 1 and 3 of three meet limits: `all` and a sender's each.
fn limited_jobs() -> (AdmitArgs, AdmitArgs, AdmitArgs) {
    use super::LimitArgs;
    let keys: Vec<std::sync::Arc<str>> = ["all", "s:x", "s:y"].map(Into::into).into();
    let bucket = |key: usize, cost: u64| LimitArgs {
        key: keys[key].clone(),
        interval_us: 1_000,
        burst: 5,
        cost,
    };
    let mut a = job("a", 0, false, false);
    a.limits = vec![bucket(0, 1), bucket(1, 1)];
    let b = job("b", 0, false, false);
    let mut c = job("c", 0, false, false);
    c.limits = vec![bucket(0, 3), bucket(2, 3)];
    (a, b, c)
}

/// The TAT each take left is its bucket's base plus what the takes of the jobs
/// up to it added, its own included, at the interval sent or the one the tail
/// names instead (a throttled bucket's); a job that did not take adds nothing.
#[test]
fn the_takes_are_replayed_from_the_bases() {
    use super::super::protocol::Verdict;
    let (a, b, c) = limited_jobs();
    let (_, numbering) = command(&CALL, &[&a, &b, &c, &a, &c], 3);
    let jobs = [&a, &b, &c, &a, &c];
    let takes = |tail: &[i64]| {
        let mut verdicts = vec![
            Verdict::Admitted(0, false, vec![]),
            Verdict::Admitted(0, false, vec![]),
            Verdict::Admitted(0, false, vec![]),
            Verdict::Limited(0, 9, 0),
            Verdict::Shadowed(0, vec![], false, vec![]),
        ];
        numbering.replay(&jobs, &mut verdicts, tail)?;
        let takes: Vec<Vec<i64>> = verdicts
            .iter()
            .map(|v| match v {
                Verdict::Admitted(.., t) | Verdict::Shadowed(.., t) => t.clone(),
                _ => vec![],
            })
            .collect();
        Some(takes)
    };
    // the bases of buckets 1 to 3, none stretched: the interval sent (1,000 µs)
    assert_eq!(
        takes(&[100, 200, 300, 0]).unwrap(),
        [
            vec![1_100, 1_200],
            vec![],
            vec![4_100, 3_300],
            vec![],
            vec![7_100, 6_300]
        ]
    );
    // every bucket stretched, to 10, 20 and 30 µs
    assert_eq!(
        takes(&[100, 200, 300, 3, 1, 10, 2, 20, 3, 30]).unwrap(),
        [
            vec![110, 220],
            vec![],
            vec![140, 390],
            vec![],
            vec![170, 480]
        ]
    );
    assert_eq!(
        takes(&[100, 200, 300]),
        None,
        "no count of stretched buckets"
    );
    assert_eq!(takes(&[100, 200, 300, 1, 1]), None, "a pair short");
    assert_eq!(takes(&[100, 200, 300, 1, 4, 10]), None, "no bucket 4");
    // a call without limits has no tail
    let (_, none) = command(&CALL, &[&b], 1);
    let mut verdicts = vec![Verdict::Admitted(0, false, vec![])];
    assert_eq!(none.replay(&[&b], &mut verdicts, &[]), Some(()));
    assert_eq!(
        none.replay(&[&b], &mut verdicts, &[0]),
        None,
        "a tail too many"
    );
}
