//! Debian's Chromium, headless, for the tests that look at a page.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Chromium's flags for this machine (closed network, root): headless, with
/// nothing reaching out, and time enough for a page's script to fetch and draw.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
];

/// The Chromium binary, if installed (`.ci/run` installs Debian's).
pub fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// `chrome` headless with a fresh profile in `profile`, a virtual-time budget of
/// `budget_ms` for the page's script, then `args` and `url`.
pub fn headless(
    chrome: &Path,
    profile: &Path,
    budget_ms: u32,
    args: &[&str],
    url: &str,
) -> std::process::Output {
    Command::new(chrome)
        .args(FLAGS)
        .arg(format!("--virtual-time-budget={budget_ms}"))
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium runs")
}
