use super::{Code, Flag, Verdict};
use crate::quota::suppression::{Kind, Suppression};
use crate::redis::lua_tables::lua_table;

const NOW: i64 = 1_700_000_000_000;

/// A job's answer as the script writes it: code, flags, payload (no quiet version).
fn answer(code: Code, flags: i64, payload: &[i64]) -> Vec<i64> {
    let mut out = vec![code as i64, flags, payload.len() as i64];
    out.extend_from_slice(payload);
    out
}

/// The verdicts of a reply without a tail (a call that carries no limits).
fn verdicts(flat: &[i64], jobs: usize) -> Option<Vec<Verdict>> {
    let (out, tail) = super::verdicts(flat, jobs)?;
    tail.is_empty().then_some(out)
}

fn reply(answers: &[Vec<i64>]) -> Vec<i64> {
    let mut out = vec![NOW];
    for a in answers {
        out.extend_from_slice(a);
    }
    out
}

#[test]
fn a_flat_reply_splits_into_each_jobs_verdict() {
    let flat = reply(&[
        answer(Code::Admitted, 0, &[]),
        answer(Code::Refused, 0, &[10, 20]),
        answer(Code::Duplicate, 0, &[]),
        answer(Code::Reserved, 0, &[55]),
        answer(Code::Replan, 0, &[]),
        answer(Code::Refused, 0, &[]),
        answer(Code::WrongType, 0, &[]),
        answer(Code::Shadowed, 0, &[30]),
        answer(Code::Elsewhere, 0, &[]),
        answer(Code::Layered, 0, &[3, 1, 5, 0, 2, 6, 7]),
        answer(Code::Suppressed, 0, &[4, 9, 0]),
        answer(Code::Admitted, Flag::INHERITED, &[]),
        answer(Code::Shadowed, Flag::INHERITED, &[40]),
        answer(Code::OptedOut, 0, &[2]),
        answer(Code::QuietHours, 0, &[7]),
    ]);
    assert_eq!(
        verdicts(&flat, 15),
        Some(vec![
            Verdict::Admitted(NOW, false, vec![]),
            Verdict::Refused(NOW, vec![10, 20], None),
            Verdict::Duplicate(NOW),
            Verdict::Reserved(NOW, 55),
            Verdict::Replan(NOW),
            Verdict::Refused(NOW, vec![], None),
            Verdict::WrongType(NOW),
            Verdict::Shadowed(NOW, vec![30], false, vec![]),
            Verdict::Elsewhere(NOW),
            Verdict::Layered(NOW, vec![vec![5], vec![], vec![6, 7]], None),
            Verdict::Suppressed(
                NOW,
                Suppression {
                    kind: Kind::Unsubscribed,
                    since: chrono::DateTime::from_timestamp_millis(9).unwrap(),
                    until: None,
                }
            ),
            Verdict::Admitted(NOW, true, vec![]),
            Verdict::Shadowed(NOW, vec![40], true, vec![]),
            Verdict::OptedOut(NOW, 2),
            Verdict::QuietHours(NOW, 7),
        ])
    );
    assert_eq!(Verdict::Reserved(NOW, 55).now(), NOW);
}

#[test]
fn a_refusal_with_quiet_hours_carries_their_version() {
    let refused = Code::Refused as i64;
    let layered = Code::Layered as i64;
    let flat = [
        NOW,
        refused,
        Flag::QUIET,
        7,
        1,
        10,
        layered,
        Flag::QUIET,
        8,
        4,
        2,
        1,
        5,
        0,
        1,
        0,
        0,
    ];
    assert_eq!(
        verdicts(&flat, 3),
        Some(vec![
            Verdict::Refused(NOW, vec![10], Some(7)),
            Verdict::Layered(NOW, vec![vec![5], vec![]], Some(8)),
            Verdict::Admitted(NOW, false, vec![]),
        ])
    );
    assert_eq!(
        verdicts(&[NOW, refused, Flag::QUIET], 1),
        None,
        "no version"
    );
    assert_eq!(
        verdicts(&[NOW, refused, Flag::QUIET, 7], 1),
        None,
        "no payload"
    );
}

#[test]
fn the_limits_tail_follows_the_answers_and_takes_are_left_to_fill() {
    let taken = Flag::TAKEN;
    let mut flat = reply(&[
        answer(Code::Admitted, taken, &[]),
        answer(Code::Shadowed, taken + Flag::INHERITED, &[30, 40]),
    ]);
    flat.extend_from_slice(&[1_700_000_000_000_123, 4, 0]);
    assert_eq!(
        super::verdicts(&flat, 2),
        Some((
            vec![
                Verdict::Admitted(NOW, false, vec![]),
                Verdict::Shadowed(NOW, vec![30, 40], true, vec![]),
            ],
            &[1_700_000_000_000_123, 4, 0][..]
        ))
    );
}

#[test]
fn a_reply_of_another_shape_is_refused() {
    let bad: [(&[i64], usize, &str); 12] = [
        (&[], 0, "no time"),
        (&[NOW, 1, 0, 0], 2, "a job short"),
        (&[NOW, 1, 0, 0, 1, 0, 0], 1, "a job over"),
        (&[NOW, 99, 0, 0], 1, "an unknown code"),
        (&[NOW, 1, 0], 1, "no payload length"),
        (&[NOW, 2, 0, 3, 10, 20], 1, "fewer times than said"),
        (&[NOW, 2, 0, -1], 1, "a negative count"),
        (&[NOW, 5, 0, 0], 1, "no reservation time"),
        (&[NOW, 9, 0, 3, 2, 1, 5], 1, "a layer short"),
        (&[NOW, 10, 0, 2, 1, 2], 1, "a suppression short"),
        (&[NOW, 11, 0, 2, 1, 2], 1, "an opt-out with two values"),
        (&[NOW, 2, 4, 0], 1, "a refused job that took"),
    ];
    for (flat, jobs, why) in bad {
        assert_eq!(verdicts(flat, jobs), None, "{why}");
    }
    assert_eq!(verdicts(&[NOW], 0), Some(vec![]));
}

/// The script and this module name the same answers and flags by the same numbers:
/// changing a number (or a name) on one side only fails here.
#[test]
fn the_script_and_the_enum_name_the_same_codes() {
    let lua = include_str!("../lua/protocol.lua");
    let ours: Vec<(String, i64)> = Code::ALL
        .iter()
        .map(|(c, name)| (name.to_string(), *c as i64))
        .collect();
    assert_eq!(lua_table(lua, "ANSWER"), ours);
    let flags: Vec<(String, i64)> = Flag::ALL
        .iter()
        .map(|(f, name)| (name.to_string(), *f))
        .collect();
    assert_eq!(lua_table(lua, "FLAG"), flags);
    let opt_outs: Vec<(String, i64)> = crate::preferences::set::OptOut::ALL
        .iter()
        .map(|(_, n, name)| (name.to_string(), *n))
        .collect();
    assert_eq!(lua_table(lua, "OPTED_OUT"), opt_outs);
}

/// The script is its parts joined in order, nothing else.
#[test]
fn the_script_is_its_parts_in_order() {
    use crate::redis::scripts::{ADMIT_LUA, ADMIT_PARTS};
    let joined: String = ADMIT_PARTS.iter().map(|(_, lua)| *lua).collect();
    assert_eq!(joined, ADMIT_LUA);
}

/// No part of the script answers a code by number: every answer is `ANSWER.name`.
#[test]
fn no_part_of_the_script_answers_by_number() {
    for (part, lua) in crate::redis::scripts::ADMIT_PARTS {
        for line in lua.lines() {
            let code = line.split("--").next().unwrap_or("").trim();
            if let Some(what) = code.strip_prefix("return ") {
                let by_number = what.starts_with(|c: char| c.is_ascii_digit());
                assert!(!by_number, "{part}: {line}");
            }
        }
    }
}
