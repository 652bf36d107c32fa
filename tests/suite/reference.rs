//! The references in `docs/reference/`, written from the code so they cannot drift:
//! `config.md` (every configuration key from the configuration types), `cli.md` and
//! `man/` (from the binary's clap definition: `quota-worker reference DIR`),
//! `metrics.md`, `dead-letters.md` and `schemas.md` (with `schema/feedback.schema.json`).
//! A page that differs from what the code writes now fails the test, which prints
//! the one command that writes them all again:
//! `QW_BLESS=1 cargo test -p quota-worker --test suite -- reference::`.
//! And every key of `config/default.toml` is in `config.md`, and every key there is
//! in `config/default.toml` (set, or shown commented).

pub(crate) mod config;
pub(crate) mod dead_letters;
mod metrics;
mod pages;
mod schemas;
mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const BLESS: &str = "QW_BLESS=1 cargo test -p quota-worker --test suite -- reference::";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every generated file: its path from the repository's root, and its text.
fn generated(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut page = |path: &str, text: String| {
        out.insert(path.to_string(), text.into_bytes());
    };
    page("docs/reference/config.md", config::page(root));
    page("docs/reference/metrics.md", metrics::page(root));
    page("docs/reference/dead-letters.md", dead_letters::page(root));
    page("docs/reference/schemas.md", schemas::page(root));
    page("schema/feedback.schema.json", schemas::feedback_file());
    // the command line, from the binary itself
    let dir = std::env::temp_dir().join(format!("qw-reference-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let status = std::process::Command::new(crate::BIN)
        .arg("reference")
        .arg(&dir)
        .status()
        .expect("quota-worker reference");
    assert!(status.success(), "quota-worker reference: {status}");
    let mut files = vec![dir.join("cli.md")];
    let mut man: Vec<PathBuf> = std::fs::read_dir(dir.join("man"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    man.sort();
    files.extend(man);
    for file in files {
        let rel = file
            .strip_prefix(&dir)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        out.insert(
            format!("docs/reference/{rel}"),
            std::fs::read(&file).unwrap(),
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
    out
}

#[test]
fn the_generated_references_are_current() {
    let root = root();
    let pages = generated(&root);
    // man pages of commands that are gone
    let man = root.join("docs/reference/man");
    let gone: Vec<String> = std::fs::read_dir(&man)
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "docs/reference/man/{}",
                e.unwrap().file_name().to_string_lossy()
            )
        })
        .filter(|p| !pages.contains_key(p))
        .collect();
    if std::env::var_os("QW_BLESS").is_some() {
        for (path, text) in &pages {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, text).unwrap();
        }
        for path in &gone {
            std::fs::remove_file(root.join(path)).unwrap();
        }
        eprintln!("wrote {} files, removed {}", pages.len(), gone.len());
        return;
    }
    let mut stale: Vec<String> = pages
        .iter()
        .filter(|(path, text)| std::fs::read(root.join(path)).ok().as_ref() != Some(*text))
        .map(|(path, _)| path.clone())
        .collect();
    stale.extend(gone.iter().map(|p| format!("{p} (no such command now)")));
    assert!(
        stale.is_empty(),
        "stale references (the code says otherwise now):\n  {}\nwrite them again with:\n  {BLESS}",
        stale.join("\n  ")
    );
}

/// Whether a key's `path` is what `pattern` (a documented key, `NAME` standing for
/// any one name) says.
fn is(pattern: &str, path: &str) -> bool {
    let (p, k): (Vec<&str>, Vec<&str>) = (pattern.split('.').collect(), path.split('.').collect());
    p.len() == k.len() && p.iter().zip(&k).all(|(p, k)| p == k || *p == "NAME")
}

/// The keys of `config/default.toml`: those set, and those shown commented out
/// (`# key = …` under a section, or `#   key: …` describing a named table's entries).
struct DefaultToml {
    set: BTreeSet<String>,
    shown: BTreeSet<String>,
    described: BTreeSet<String>,
}

fn default_toml(root: &Path) -> DefaultToml {
    let text = std::fs::read_to_string(root.join("config/default.toml")).unwrap();
    let mut keys = DefaultToml {
        set: BTreeSet::new(),
        shown: BTreeSet::new(),
        described: BTreeSet::new(),
    };
    let word = |s: &str| -> Option<String> {
        let w: String = s
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        (!w.is_empty()).then_some(w)
    };
    // the section of the keys set (the last header set) and of the keys shown
    // commented out (the last header, set or shown)
    let (mut live, mut shown) = (String::new(), String::new());
    for line in text.lines() {
        let commented = line.starts_with('#');
        let body = line.trim_start_matches('#').trim();
        if let Some(name) = body.strip_prefix('[').and_then(|b| b.split_once(']')) {
            if !name.0.contains(' ') && !name.0.contains('{') {
                shown = name.0.to_string();
                if !commented {
                    live = shown.clone();
                }
                continue;
            }
        }
        let Some(key) = word(body) else { continue };
        let rest = body[key.len()..].trim_start();
        if rest.starts_with('=') {
            if commented {
                keys.shown.insert(format!("{shown}.{key}"));
            } else {
                keys.set.insert(format!("{live}.{key}"));
            }
        } else if commented && rest.starts_with(':') && line.starts_with("#   ") {
            keys.described.insert(key);
        }
    }
    // the keys of inline tables (`rules = [{ limit = 1, window = "1d" }]`)
    for part in text.split(['{', ',']) {
        if let Some(key) = word(part.trim()) {
            if part.trim()[key.len()..].trim_start().starts_with('=') {
                keys.described.insert(key);
            }
        }
    }
    keys
}

#[test]
fn every_key_of_default_toml_is_documented_and_every_documented_key_is_in_it() {
    let root = root();
    let (documented, _) = config::keys(&root);
    let toml = default_toml(&root);
    let undocumented: Vec<&String> = toml
        .set
        .iter()
        .filter(|k| !documented.iter().any(|d| is(&d.path, k)))
        .collect();
    let missing: Vec<&str> = documented
        .iter()
        .filter(|d| !d.ty.starts_with("table of named entries") && d.default != "refused")
        .map(|d| d.path.as_str())
        .filter(|path| {
            let last = path.rsplit('.').next().unwrap();
            let in_file = toml.set.iter().chain(&toml.shown).any(|k| is(path, k));
            let named = toml
                .set
                .iter()
                .chain(&toml.shown)
                .filter_map(|k| k.rsplit('.').next())
                .chain(toml.described.iter().map(String::as_str))
                .any(|w| w == last);
            !(in_file || path.contains("NAME") && named)
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "keys of config/default.toml no configuration type has: {undocumented:?}"
    );
    assert!(
        missing.is_empty(),
        "keys config.md documents that config/default.toml neither sets nor shows: {missing:?}"
    );
}

#[test]
fn a_refused_key_is_refused() {
    for (key, _) in config::REFUSED {
        let var = format!("QUOTA_WORKER__{}", key.to_uppercase().replace('.', "__"));
        let vars = [
            (
                "QUOTA_WORKER__REDIS__URL".to_string(),
                "rediss://127.0.0.1:6380".to_string(),
            ),
            (var, "example.internal".to_string()),
        ];
        let refused = quota_worker::config::Settings::load_from_vars(None, vars)
            .expect_err("the key is refused");
        assert_eq!(refused.key(), Some(*key), "{refused}");
    }
}
