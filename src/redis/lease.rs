//! `lua/lease.lua`: a lease taken with `SET key token NX PX ms`, renewed or ended
//! if it is still its taker's; its reply, by name.

use redis::Script;

use super::conn::RedisConn;
use super::StoreError;

/// The script's answers (`LEASE` in `lua/lease.lua`; a test checks that both sides
/// name the same numbers).
struct Code;

impl Code {
    const LOST: i64 = 0;
    const KEPT: i64 = 1;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 2] = [(Code::LOST, "lost"), (Code::KEPT, "kept")];
}

/// Renew the lease `key` of `token` for `ttl_ms` (`ttl_ms` `None`: end it): `true`
/// when it was still the taker's, `false` when it was lost (run out, and maybe
/// taken by another).
pub(crate) async fn renew_or_end(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    token: &str,
    ttl_ms: Option<u64>,
) -> Result<bool, StoreError> {
    let mut conn = conn.clone();
    let mut call = script.key(key);
    call.arg(token);
    if let Some(ms) = ttl_ms {
        call.arg(ms);
    }
    let code: i64 = call.invoke_async(&mut conn).await?;
    match code {
        Code::KEPT => Ok(true),
        Code::LOST => Ok(false),
        _ => Err(StoreError::Reply {
            script: "lease.lua",
            reply: vec![code],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::redis::lua_tables::speaks_by_name;

    const LUA: &str = include_str!("../../lua/lease.lua");

    /// The script and [`Code`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        speaks_by_name("lease.lua", LUA, "LEASE", &Code::ALL);
    }
}
