//! What every generated page must say as a user reads it: no Rust path
//! (`crate::…`, `Type::method`) or rustdoc link, only values the configuration's
//! parser accepts, and in `cli.md` every flag a command's man page lists (the
//! global ones included).

use std::collections::BTreeSet;

use quota_worker::config::Settings;

use super::config::{keys, Key};

/// Where `text` holds something of Rust's rather than the user's: each as
/// `line N: what`.
pub fn rust_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut say = |what: String| found.push(format!("line {}: {what}", n + 1));
        for path in ["crate::", "super::", "self::"] {
            if line.contains(path) {
                say(format!("a Rust path (`{path}`)"));
            }
        }
        // an intra-doc link: [`X`] not followed by a Markdown target
        let mut rest = line;
        while let Some(at) = rest.find("[`") {
            let after = &rest[at + 2..];
            let Some(end) = after.find("`]") else { break };
            if !after[end + 2..].starts_with('(') {
                say(format!("a rustdoc link [`{}`]", &after[..end]));
            }
            rest = &after[end + 2..];
        }
        // a code span naming a Rust item: `Type::item`
        for span in line.split('`').skip(1).step_by(2) {
            let mut parts = span.split("::");
            let first = parts.next().unwrap_or_default();
            let item = |p: &str| {
                p.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                    && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            if span.contains("::")
                && first.starts_with(|c: char| c.is_ascii_uppercase())
                && item(first)
                && parts.all(|p| item(p.trim_end_matches("()")))
            {
                say(format!("a Rust item `{span}`"));
            }
        }
    }
    found
}

#[test]
fn rust_in_finds_what_a_page_must_not_hold() {
    let bad = [
        "(the default, `crate::quota::prefetch::AUTO_CEILING`)",
        "printed as [`REDACTED`].",
        "(see `RedisConn::dedicated`)",
        "as [`Settings::load`] does",
    ];
    for line in bad {
        assert!(!rust_in(line).is_empty(), "{line}");
    }
    let good = [
        "printed as `<redacted>`; `\"auto\"` (the default: at most `1024`)",
        "see [`config.md`](config.md) and `QUOTA_WORKER__REDIS__URL`",
        "| `--tenant <TENANT>` | | | The tenant: `[tenants.NAME]` |",
    ];
    for line in good {
        assert!(rust_in(line).is_empty(), "{line}: {:?}", rust_in(line));
    }
}

#[test]
fn no_generated_page_holds_a_rust_path_or_a_rustdoc_link() {
    let pages = super::generated(&super::root());
    let mut found = Vec::new();
    for (path, text) in &pages {
        for what in rust_in(&String::from_utf8_lossy(text)) {
            found.push(format!("{path}: {what}"));
        }
    }
    assert!(
        found.is_empty(),
        "generated pages with Rust in them (write the doc comment or the generator so \
         the page says what a user writes):\n  {}",
        found.join("\n  ")
    );
}

/// The values a key's type lists as a user writes them: each `` `"…"` `` of it.
fn listed(ty: &str) -> Vec<String> {
    ty.split("`\"")
        .skip(1)
        .filter_map(|s| s.split_once("\"`").map(|(v, _)| v.to_string()))
        .collect()
}

/// The configuration with `key` (a documented key, `NAME` standing for an entry:
/// the `default` policy, or a new entry elsewhere) set to `value` in a file, read
/// as the worker reads it: `Err` with the key the parser refused, if it did.
fn load_with(key: &Key, value: &str) -> Result<(), String> {
    let path = match key.path.split_once(".NAME.") {
        Some(("policies", rest)) => format!("policies.default.{rest}"),
        Some((table, rest)) => format!("{table}.reference_check.{rest}"),
        None => key.path.clone(),
    };
    let (table, last) = path.rsplit_once('.').unwrap();
    let value = if key.ty.starts_with("list of") {
        format!("[\"{value}\"]")
    } else {
        format!("\"{value}\"")
    };
    let file = std::env::temp_dir().join(format!(
        "qw-reference-{}-{}.toml",
        std::process::id(),
        path.replace('.', "-")
    ));
    std::fs::write(&file, format!("[{table}]\n{last} = {value}\n")).unwrap();
    let loaded = Settings::load_from_vars(Some(&file), Vec::new());
    std::fs::remove_file(&file).unwrap();
    match loaded {
        Err(e) if e.key().is_some_and(|k| k.starts_with(&path)) => Err(e.to_string()),
        _ => Ok(()),
    }
}

#[test]
fn every_value_config_md_lists_is_one_the_parser_accepts() {
    let (keys, _) = keys(&super::root());
    let with_values: Vec<&Key> = keys.iter().filter(|k| !listed(&k.ty).is_empty()).collect();
    assert!(
        with_values.len() >= 10,
        "{} keys list values",
        with_values.len()
    );
    let mut refused = Vec::new();
    for key in with_values {
        // the check can fail: a value no key takes is refused, naming the key
        assert!(
            load_with(key, "not a value of this key").is_err(),
            "`{}` = \"not a value of this key\" was not refused naming the key",
            key.path
        );
        for value in listed(&key.ty) {
            if let Err(why) = load_with(key, &value) {
                refused.push(format!("`{}` = \"{value}\": {why}", key.path));
            }
        }
    }
    assert!(
        refused.is_empty(),
        "config.md lists values the parser refuses:\n  {}",
        refused.join("\n  ")
    );
}

/// The long flags in the lines of `text` that start with `start` (a man page's
/// option lines, `cli.md`'s table rows).
fn long_flags(text: &str, start: &str) -> BTreeSet<String> {
    let text = text
        .replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fR", "");
    text.lines()
        .filter(|l| l.starts_with(start))
        .flat_map(|l| {
            l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn cli_md_lists_every_flag_each_man_page_lists() {
    let pages = super::generated(&super::root());
    let cli = String::from_utf8(pages["docs/reference/cli.md"].clone()).unwrap();
    let mut missing = Vec::new();
    let mut globals_below_the_top = 0;
    for (path, text) in pages.iter().filter(|(p, _)| p.ends_with(".1")) {
        let man = String::from_utf8_lossy(text).into_owned();
        // the command, as the synopsis names it
        let synopsis = man.split(".SH SYNOPSIS\n").nth(1).unwrap_or_default();
        let command = synopsis.split("\\fR").next().unwrap_or_default();
        let command = command.trim_start_matches("\\fB").replace("\\-", "-");
        let section = cli
            .split(&format!("\n## {command}\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("cli.md has no section for `{command}` ({path})"));
        let section = section.split("\n## ").next().unwrap();
        let listed = long_flags(section, "| `");
        for flag in long_flags(&man, "-") {
            if !listed.contains(&flag) {
                missing.push(format!("{command} {flag}"));
            } else if command.contains(' ') && flag == "--config" {
                globals_below_the_top += 1;
            }
        }
    }
    assert!(
        missing.is_empty(),
        "flags cli.md does not list: {missing:?}"
    );
    assert!(globals_below_the_top > 10, "{globals_below_the_top}");
}
