//! `quota-worker admin resume`: delete the pause mark a worker set in Redis when it
//! found Redis without its data (`redis.on_reset = "pause"`). Every worker reads it
//! each second, so one command resumes them all; no HTTP is needed.

use std::process::ExitCode;

use quota_worker::config::Settings;
use quota_worker::redis::marker;

use super::{print_json, store};

/// Delete the pause mark; say what it said, or that nothing was paused. Exit 0.
pub async fn resume(settings: &Settings, json: bool) -> anyhow::Result<ExitCode> {
    let store = store(settings).await?;
    let was = marker::resume(&store.connection(), store.keys()).await?;
    if json {
        print_json(&serde_json::json!({ "resumed": was.is_some(), "paused_because": was }))?;
    } else {
        match was {
            Some(why) => println!(
                "resumed: every worker decides the held jobs again within a second; they \
                 come back from the delay ladder within a minute (was: {why})"
            ),
            None => println!("nothing was paused"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
