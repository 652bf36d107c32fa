//! `dead-letters.md`: every reason a job is dead-lettered for and every header the
//! worker writes on a job, from their definitions: the `Reason` enum of
//! `src/job/outcome.rs` (its variants' doc comments, and the words `Reason::as_str`
//! gives them), the header constants of `src/job/headers.rs` and the delay ladder's
//! bit prefix (`src/amqp/ladder.rs`).

use std::fmt::Write as _;
use std::path::Path;

use super::source::{one_line, str_consts, Types};

/// (word, meaning) of every dead-letter reason, in declaration order.
pub fn reasons(root: &Path) -> Vec<(String, String)> {
    let types = Types::read(root, &[], &["src/job/outcome.rs"], None);
    let code = std::fs::read_to_string(root.join("src/job/outcome.rs")).unwrap();
    let (_, variants) = &types.enums["Reason"];
    variants
        .iter()
        .map(|v| {
            let arm = format!("Reason::{} => \"", v.name);
            let at = code
                .find(&arm)
                .unwrap_or_else(|| panic!("no word for Reason::{}", v.name));
            let rest = &code[at + arm.len()..];
            (
                rest[..rest.find('"').unwrap()].to_string(),
                one_line(&v.docs),
            )
        })
        .collect()
}

/// The page.
pub fn page(root: &Path) -> String {
    let mut o = String::from(
        "# Dead letters and headers\n\n\
         <!-- Generated from src/job/outcome.rs, src/job/headers.rs and \
         src/amqp/ladder.rs by the suite's `reference` tests; do not edit (see README.md \
         here). -->\n\n\
         A job the worker cannot or must not send goes to the dead-letter exchange \
         (`amqp.dead_exchange`, queue `amqp.dead_queue`) once, its body untouched, with \
         the reason in `x-notify-reason` and a sentence for people in `x-notify-detail`. \
         `quota-worker admin dead` lists, shows, replays and purges them; \
         `quota_worker_jobs_total{outcome=\"dead\",reason}` counts them.\n\n\
         ## Reasons\n\n\
         | `x-notify-reason` | Why |\n|---|---|\n",
    );
    for (word, why) in reasons(root) {
        let _ = writeln!(o, "| `{word}` | {why} |");
    }
    o.push_str(
        "\n## Headers\n\n\
         The headers the worker writes on the jobs it publishes onwards (round the delay \
         ladder, to a lane, to the dispatch exchange after an earlier attempt, to the \
         dead letters).\n\n\
         | Header | Meaning |\n|---|---|\n",
    );
    let headers = std::fs::read_to_string(root.join("src/job/headers.rs")).unwrap();
    for (_, value, docs) in str_consts(&headers) {
        if value.starts_with("x-") {
            let docs = one_line(docs.strip_prefix("Header: ").unwrap_or(&docs));
            let mut chars = docs.chars();
            let docs: String = chars
                .next()
                .map(|c| c.to_ascii_uppercase())
                .into_iter()
                .chain(chars)
                .collect();
            let _ = writeln!(o, "| `{value}` | {docs} |");
        }
    }
    let ladder = std::fs::read_to_string(root.join("src/amqp/ladder.rs")).unwrap();
    for (_, value, docs) in str_consts(&ladder) {
        let _ = writeln!(o, "| `{value}*` | {} |", one_line(&docs));
    }
    o.push_str(
        "\nThe worker drops the ladder's bits and the broker's `x-death`, \
         `x-first-death-*` and `x-last-death-*` headers whenever it publishes a job \
         onwards, so a job republished by hand goes round the ladder normally.\n",
    );
    o
}
