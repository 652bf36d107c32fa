//! No broken link in the documentation: every relative link and image in every Markdown
//! file of the repository names a file or folder that exists, and every anchor
//! (`page.md#section`, `#section`) names a heading of its page, by GitHub's rule
//! (lowercase; letters, digits, `-` and `_` kept, other punctuation dropped, each space a
//! `-`; a repeated heading gets `-1`, `-2`, ...). Links inside code (fenced blocks and
//! `inline spans`) are not links. Web addresses are not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// Pages that other work adds to the repository: a link to one of them is allowed while
/// it does not exist yet (once it exists, its links and anchors are checked like any).
const PENDING: &[&str] = &[];

/// Every `.md` file under `root`, as paths relative to it (build output, dependencies
/// and hidden folders left out).
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    walk(&path, root, out);
                }
            } else if name.ends_with(".md") {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// A line with its inline code spans taken out.
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// GitHub's anchor for a heading's text.
fn slug(heading: &str) -> String {
    // a link in a heading shows its text
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](") else {
            break;
        };
        let Some(end) = rest[open + close..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + close]);
        rest = &rest[open + close + end + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == '-' || c == '_' || c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text: one per heading, repeated ones numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let t = line.trim_start();
        let hashes = t.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !t[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(t[hashes..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets of a Markdown text: `[text](target)`, `![alt](target)` and
/// `[label]: target`, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        let line = without_code(line);
        let t = line.trim_start();
        if t.starts_with('[') {
            if let Some(i) = t.find("]: ") {
                if !t[..i].contains('(') {
                    out.push((n, t[i + 3..].trim().to_string()));
                    continue;
                }
            }
        }
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            out.push((n, after[..end].to_string()));
            rest = &after[end + 1..];
        }
    }
    out.into_iter()
        .map(|(n, target)| {
            let target = target.split_whitespace().next().unwrap_or("").to_string();
            (n, target.trim_matches(['<', '>']).to_string())
        })
        .collect()
}

/// `base/rel` with `.` and `..` resolved, or None when it climbs out of the root.
fn join(base: &Path, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            c => out.push(c),
        }
    }
    Some(out)
}

/// Every broken link of the Markdown files under `root`, as `file:line: target: why`.
fn broken_links(root: &Path, pending: &[&str]) -> Vec<String> {
    let files = markdown_files(root);
    let mut texts: BTreeMap<PathBuf, String> = BTreeMap::new();
    for f in &files {
        texts.insert(f.clone(), std::fs::read_to_string(root.join(f)).unwrap());
    }
    let mut anchor_cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut problems = Vec::new();
    for f in &files {
        let dir = f.parent().unwrap_or(Path::new(""));
        for (line, target) in links(&texts[f]) {
            if target.is_empty()
                || target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with('/')
            {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                f.clone()
            } else {
                match join(dir, path) {
                    Some(p) => p,
                    None => {
                        problems.push(format!(
                            "{}:{line}: {target}: outside the repository",
                            f.display()
                        ));
                        continue;
                    }
                }
            };
            if !root.join(&file).exists() {
                let allowed = pending.iter().any(|p| Path::new(p) == file);
                if !allowed {
                    problems.push(format!("{}:{line}: {target}: no such file", f.display()));
                }
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_none_or(|e| e != "md") || root.join(&file).is_dir() {
                continue;
            }
            let known = anchor_cache.entry(file.clone()).or_insert_with(|| {
                anchors(
                    &texts
                        .get(&file)
                        .cloned()
                        .unwrap_or_else(|| std::fs::read_to_string(root.join(&file)).unwrap()),
                )
            });
            if !known.contains(anchor) {
                problems.push(format!(
                    "{}:{line}: {target}: no heading `#{anchor}` in {}",
                    f.display(),
                    file.display()
                ));
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_and_anchor_in_the_markdown_files_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(
        files.iter().any(|f| f == Path::new("README.md"))
            && files.iter().any(|f| f.starts_with("docs")),
        "the Markdown files were found: {files:?}"
    );
    let problems = broken_links(root, PENDING);
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn github_anchors() {
    let cases = [
        ("A job, end to end", "a-job-end-to-end"),
        ("Schedules: `not_before`", "schedules-not_before"),
        ("The job's fields", "the-jobs-fields"),
        (
            "Time: send windows, quiet hours",
            "time-send-windows-quiet-hours",
        ),
        ("Figures & plots — 2026", "figures--plots--2026"),
        ("See [the guide](docs/guide/time.md)", "see-the-guide"),
        (
            "RabbitMQ users: least privilege",
            "rabbitmq-users-least-privilege",
        ),
    ];
    for (heading, anchor) in cases {
        assert_eq!(slug(heading), anchor, "{heading}");
    }
    let text = "# Title\n\n## Notes\n\n```sh\n# not a heading\n```\n\n## Notes\n";
    assert_eq!(
        anchors(text),
        ["notes", "notes-1", "title"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

#[test]
fn a_broken_link_an_unknown_anchor_and_a_missing_image_are_each_found() {
    let root = testkit::temp_dir("docs-links");
    std::fs::create_dir_all(root.join("docs/guide")).unwrap();
    std::fs::write(root.join("docs/pic.png"), b"png").unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n## A section\n\n[ok](docs/guide/page.md#the-page) [ok](#a-section) \
         ![ok](docs/pic.png) [web](https://example.com/x.md) `[code](nowhere.md)`\n\
         [gone](docs/guide/gone.md) [bad anchor](docs/guide/page.md#nothing)\n\
         ![gone](docs/missing.png) [pending](docs/reference/later.md)\n\n\
         ```text\n[in a block](nowhere.md)\n```\n",
    )
    .unwrap();
    std::fs::write(
        root.join("docs/guide/page.md"),
        "# The page\n\n[up](../../README.md#a-section) [self](#no-such)\n",
    )
    .unwrap();
    let problems = broken_links(&root, &["docs/reference/later.md"]);
    let found = |s: &str| problems.iter().any(|p| p.contains(s));
    assert!(
        found("README.md:6: docs/guide/gone.md: no such file"),
        "{problems:?}"
    );
    assert!(
        found("README.md:6: docs/guide/page.md#nothing: no heading"),
        "{problems:?}"
    );
    assert!(
        found("README.md:7: docs/missing.png: no such file"),
        "{problems:?}"
    );
    assert!(
        found("docs/guide/page.md:3: #no-such: no heading"),
        "{problems:?}"
    );
    assert_eq!(problems.len(), 4, "only those: {problems:?}");
    std::fs::remove_dir_all(&root).unwrap();
}

/// The delay causes, as `DelayCause::LABELS` in `src/decide/mod.rs` lists them.
fn delay_causes(root: &Path) -> Vec<String> {
    let code = std::fs::read_to_string(root.join("src/decide/mod.rs")).unwrap();
    let at = code.find("const LABELS").expect("DelayCause::LABELS");
    let list = &code[at..];
    let list = &list[list.find("= [").unwrap() + 3..list.find("];").unwrap()];
    let causes: Vec<String> = list
        .split(',')
        .map(|w| w.trim().trim_matches('"').to_string())
        .filter(|w| !w.is_empty())
        .collect();
    assert!(causes.len() >= 7, "{causes:?}");
    causes
}

/// Each word of `words` that `text` does not show as `` `word` ``.
fn unnamed<'a>(text: &str, words: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    words
        .into_iter()
        .filter(|w| !text.contains(&format!("`{w}`")))
        .cloned()
        .collect()
}

/// The configuration guide's table of sections names every key of the configuration
/// types (or the sub-table it is in, `[amqp.tls]`, `digest`), in its section's row.
#[test]
fn the_configuration_guide_names_every_key() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = std::fs::read_to_string(root.join("docs/guide/configuration.md")).unwrap();
    let rows: Vec<(&str, &str)> = guide
        .lines()
        .filter(|l| l.starts_with("| `["))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            (cells[0], cells.get(1).copied().unwrap_or(""))
        })
        .collect();
    let (keys, _) = crate::reference::config::keys(root);
    let mut missing = Vec::new();
    for key in keys {
        let segments: Vec<&str> = key.path.split('.').filter(|s| *s != "NAME").collect();
        let [section, rest @ ..] = segments.as_slice() else {
            continue;
        };
        if rest.is_empty() {
            continue;
        }
        let Some((_, text)) = rows.iter().find(|(head, _)| {
            head.contains(&format!("`[{section}]`"))
                || head.contains(&format!("`[{section}.NAME]`"))
        }) else {
            missing.push(format!("{}: no row for [{section}]", key.path));
            continue;
        };
        let named = rest.iter().any(|s| {
            text.contains(&format!("`{s}`"))
                || text.contains(&format!("`[{section}.{s}]`"))
                || text.contains(&format!("`[{section}.NAME.{s}]`"))
        });
        if !named {
            missing.push(key.path.clone());
        }
    }
    assert!(
        missing.is_empty(),
        "keys docs/guide/configuration.md's table does not name: {missing:?}"
    );
}

/// The operating guide and README name every delay cause and every dead-letter reason
/// the code has.
#[test]
fn the_operating_guide_and_readme_name_every_delay_cause_and_dead_letter_reason() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let causes = delay_causes(root);
    let reasons: Vec<String> = crate::reference::dead_letters::reasons(root)
        .into_iter()
        .map(|(word, _)| word)
        .collect();
    assert!(reasons.iter().any(|r| r == "opted_out"), "{reasons:?}");
    for page in ["docs/guide/operating.md", "README.md"] {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        let causes_missing = unnamed(&text, &causes);
        let reasons_missing = unnamed(&text, &reasons);
        assert!(
            causes_missing.is_empty() && reasons_missing.is_empty(),
            "{page} does not name the delay causes {causes_missing:?} nor the dead-letter reasons {reasons_missing:?}"
        );
    }
}

/// No example gives a job a fixed date that goes stale (`expires_at`, `not_before`,
/// `--expires-at`, `--not-before` followed by a literal date): one copied a week
/// later would be dead-lettered `expired` or sent at once.
#[test]
fn no_example_gives_a_job_a_date_that_goes_stale() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut stale = Vec::new();
    for file in markdown_files(root)
        .into_iter()
        .filter(|f| !f.starts_with("docs/notes") && !f.starts_with("docs/reference"))
    {
        let text = std::fs::read_to_string(root.join(&file)).unwrap();
        for (n, line) in text.lines().enumerate() {
            for field in [
                "\"expires_at\":",
                "\"not_before\":",
                "--expires-at ",
                "--not-before ",
            ] {
                let Some(at) = line.find(field) else { continue };
                let value = line[at + field.len()..]
                    .trim_start()
                    .trim_start_matches('"');
                let dated = value.len() >= 10
                    && value.as_bytes()[..10].iter().enumerate().all(|(i, b)| {
                        if i == 4 || i == 7 {
                            *b == b'-'
                        } else {
                            b.is_ascii_digit()
                        }
                    });
                if dated {
                    stale.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "fixed dates in examples:\n{}",
        stale.join("\n")
    );
}
