//! `lua/digest_reopen.lua`: a `held` digest refused when it went, open again until
//! its caps' next instant, and the index told when it closes.

use redis::Script;

use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// The script's answers (`REOPEN` in `lua/digest_reopen.lua`; a test checks that
/// both sides name the same numbers).
struct Code;

impl Code {
    const GONE: i64 = 0;
    const REOPENED: i64 = 1;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 2] = [(Code::GONE, "gone"), (Code::REOPENED, "reopened")];
}

/// A `held` digest refused when it went opens again, closing at `close_at_ms`
/// (see `lua/digest_reopen.lua`), and the index learns when; `false` when it is
/// gone.
pub async fn reopen(
    conn: &RedisConn,
    script: &Script,
    index: &str,
    key: &str,
    close_at_ms: i64,
    keep_ms: u64,
) -> Result<bool, StoreError> {
    let Some(crate::quota::keys::DigestKeys { meta, items, order }) =
        crate::quota::keys::digest_keys(key)
    else {
        return Ok(false);
    };
    let base = &meta[..meta.rfind("dgm/").unwrap_or(0)];
    let mut conn = conn.clone();
    let code: i64 = script
        .key(&meta)
        .key(&items)
        .key(&order)
        .arg(close_at_ms)
        .arg(base)
        .arg(keep_ms)
        .invoke_async(&mut conn)
        .await?;
    let reopened = match code {
        Code::REOPENED => true,
        Code::GONE => false,
        _ => {
            return Err(StoreError::Reply {
                script: "digest_reopen.lua",
                reply: vec![code],
            })
        }
    };
    if reopened {
        let _: i64 = redis::cmd("ZADD")
            .arg(index)
            .arg(close_at_ms)
            .arg(key)
            .query_async(&mut conn)
            .await?;
    }
    Ok(reopened)
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::redis::lua_tables::speaks_by_name;

    const LUA: &str = include_str!("../../../lua/digest_reopen.lua");

    /// The script and [`Code`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        speaks_by_name("digest_reopen.lua", LUA, "REOPEN", &Code::ALL);
    }
}
