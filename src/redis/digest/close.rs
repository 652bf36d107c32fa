//! `lua/digest_close.lua`: a digest closed (no item joins it from then on) and its
//! items read, or not yet (a sliding digest whose close a later item moved).

use redis::Script;

use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// A closed digest as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// Its head (JSON).
    pub head: String,
    /// The settings it opened with.
    pub spec: String,
    /// Redis time at the close (ms).
    pub now_ms: i64,
    /// Its items (JSON), in the order they were folded.
    pub items: Vec<String>,
}

/// What a close found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Close {
    /// The digest is gone (done already).
    Gone,
    /// A later item moved its close to this instant (ms; `sliding`): it stays open.
    NotYet(i64),
    /// Closed: no item joins it from now on.
    Closed(Closed),
}

/// What the script's reply opens with (`CLOSE` in `lua/digest_close.lua`; a test
/// checks that both sides name the same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Gone = 0,
    Closed = 1,
    NotYet = 2,
}

impl Answer {
    /// Every answer, with its name in the script.
    const ALL: [(Answer, &'static str); 3] = [
        (Answer::Gone, "gone"),
        (Answer::Closed, "closed"),
        (Answer::NotYet, "not_yet"),
    ];

    /// The answer the script's first value names (`None`: none of them).
    fn read(first: Option<&str>) -> Option<Answer> {
        let n: i64 = first?.parse().ok()?;
        Answer::ALL.iter().map(|(a, _)| *a).find(|a| *a as i64 == n)
    }
}

/// Close the digest at `key` (see `lua/digest_close.lua`): when it is due, or now
/// whatever its close instant (`now`: a flush).
pub async fn close(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    now: bool,
) -> Result<Close, StoreError> {
    let Some(crate::quota::keys::DigestKeys { meta, items, order }) =
        crate::quota::keys::digest_keys(key)
    else {
        return Ok(Close::Gone);
    };
    let mut conn = conn.clone();
    let reply: Vec<String> = script
        .key(&meta)
        .key(&items)
        .key(&order)
        .arg(if now { "now" } else { "due" })
        .invoke_async(&mut conn)
        .await?;
    let mut parts = reply.into_iter();
    match Answer::read(parts.next().as_deref()) {
        Some(Answer::Closed) => {}
        Some(Answer::NotYet) => {
            let at = parts
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_default();
            return Ok(Close::NotYet(at));
        }
        Some(Answer::Gone) | None => return Ok(Close::Gone),
    }
    let head = parts.next().unwrap_or_default();
    let spec = parts.next().unwrap_or_default();
    let now_ms = parts
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    let items = parts.collect();
    Ok(Close::Closed(Closed {
        head,
        spec,
        now_ms,
        items,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::lua_tables::{lua_table, positional_returns};

    const LUA: &str = include_str!("../../../lua/digest_close.lua");

    /// The script and [`Answer`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        let ours: Vec<(String, i64)> = Answer::ALL
            .iter()
            .map(|(a, name)| (name.to_string(), *a as i64))
            .collect();
        assert_eq!(lua_table(LUA, "CLOSE"), ours);
        let found = positional_returns("digest_close.lua", LUA);
        assert!(found.is_empty(), "{found:#?}");
        assert_eq!(Answer::read(Some("2")), Some(Answer::NotYet));
        assert_eq!(Answer::read(Some("x")), None);
    }
}
