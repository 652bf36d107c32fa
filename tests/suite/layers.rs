//! The layers only look down: no import circle between the source files of any crate
//! of the workspace. A file's imports are the paths it names from `crate::`, `self::`
//! or `super::` (in `use` lines and inline, `super::x::Y::new()` as much as
//! `use crate::x::Y`), as `../shared/tools/rust-cycles.py` reads them; each resolves to the longest module path that is a file, and a
//! file's imports of its own ancestors (`mod.rs` of its folder) do not count. A circle
//! is a strongly connected set of two or more files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The source files of a crate by module path (`lib.rs`, `main.rs` and `bin/` left out:
/// they are the roots every layer sits under).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, src, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|m| m == "mod") {
                module.pop();
            }
            let root = module == ["lib"]
                || module == ["main"]
                || module.first().is_some_and(|m| m == "bin");
            if !root && !module.is_empty() {
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The module a path's first words name: `crate` the root, `self` the file's own
/// module, each `super` one level up (a `mod.rs` file is keyed by its folder, so the
/// same counting holds for it).
fn base(words: &[&str], module: &[String]) -> Module {
    match words {
        ["crate", ..] => Vec::new(),
        _ => {
            let ups = words.iter().filter(|w| **w == "super").count();
            module[..module.len().saturating_sub(ups)].to_vec()
        }
    }
}

/// Every path a file names that starts at `crate::`, `self::` or `super::` (chains of
/// `super::` too), as an absolute module path: in `use` lines, with
/// `use crate::a::{b, c::d}` expanded, and inline (`super::x::Y::new()`).
fn imports(text: &str, module: &[String]) -> BTreeSet<Module> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let split = |s: &str| -> Vec<String> {
        s.split("::")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect()
    };
    // the root words a path opens with (`super::super::`), and what follows them
    let root = |path: &str| -> Option<(Module, String)> {
        let mut words = Vec::new();
        let mut rest = path;
        while let Some((word, tail)) = rest.split_once("::") {
            let word = word.trim();
            let first = words.is_empty();
            if (first && ["crate", "self", "super"].contains(&word)) || (!first && word == "super")
            {
                words.push(word);
                rest = tail;
            } else {
                break;
            }
        }
        (!words.is_empty()).then(|| (base(&words, module), rest.to_string()))
    };
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let bytes = code.as_bytes();
    let mut out = BTreeSet::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("use ") {
        let start = from + at;
        from = start + "use ".len();
        if start > 0 && is_word(bytes[start - 1]) {
            continue;
        }
        let body = &code[from..];
        let body = &body[..body.find(';').unwrap_or(body.len())];
        let Some((head, body)) = root(body.trim_start()) else {
            continue;
        };
        match body.split_once('{') {
            Some((more, items)) => {
                let head = [head, split(more)].concat();
                for item in items.split([',', '{', '}']) {
                    let item = item.split(" as ").next().unwrap_or("").trim();
                    if !item.is_empty() && item != "self" {
                        out.insert([head.clone(), split(item)].concat());
                    }
                }
                out.insert(head);
            }
            None => {
                out.insert([head, split(body.split(" as ").next().unwrap_or(""))].concat());
            }
        }
    }
    // inline paths: a root word not preceded by a word or `::`, with what follows it
    for word in ["crate::", "self::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(word) {
            let start = from + at;
            from = start + word.len();
            if start > 0 && (is_word(bytes[start - 1]) || bytes[start - 1] == b':') {
                continue;
            }
            let path: String = code[start..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            if let Some((head, rest)) = root(&path) {
                out.insert([head, split(rest.trim_end_matches(':'))].concat());
            }
        }
    }
    out
}

/// The circles (strongly connected sets of two or more files) of a crate's imports.
fn circles(src: &Path) -> Vec<Vec<String>> {
    let files = modules(src);
    let resolve = |path: &Module| {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| files.contains_key(p))
    };
    let graph: BTreeMap<&Module, BTreeSet<Module>> = files
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).unwrap();
            let targets = imports(&text, module)
                .iter()
                .filter_map(resolve)
                .filter(|t| t != module && !module.starts_with(t))
                .collect();
            (module, targets)
        })
        .collect();
    // Kosaraju: order by finish time, then walk the reversed graph.
    fn finish<'a>(
        v: &'a Module,
        graph: &'a BTreeMap<&'a Module, BTreeSet<Module>>,
        seen: &mut BTreeSet<&'a Module>,
        order: &mut Vec<&'a Module>,
    ) {
        if !seen.insert(v) {
            return;
        }
        for w in &graph[v] {
            let (w, _) = graph.get_key_value(w).unwrap();
            finish(w, graph, seen, order);
        }
        order.push(v);
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for v in graph.keys() {
        finish(v, &graph, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (v, targets) in &graph {
        for w in targets {
            let (w, _) = graph.get_key_value(w).unwrap();
            reversed.entry(*w).or_default().push(*v);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.into_iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![v];
        while let Some(u) = stack.pop() {
            if assigned.insert(u) {
                component.push(u.join("::"));
                stack.extend(reversed.get(u).into_iter().flatten().copied());
            }
        }
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

#[test]
fn no_crate_of_the_workspace_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for krate in ["src", "bench/src", "producer/src", "testkit/src"] {
        let src = root.join(krate);
        if src.is_dir() {
            for circle in circles(&src) {
                found.push(format!("{krate}: {}", circle.join(" <-> ")));
            }
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_check_finds_a_circle_it_is_shown() {
    let dir = std::env::temp_dir().join(format!("qw-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::b::{c::D, E};\n").unwrap();
    std::fs::write(dir.join("b/mod.rs"), "// use crate::a;\npub mod c;\n").unwrap();
    std::fs::write(
        dir.join("b/c.rs"),
        "fn f() { crate::a::g(); }\nuse crate::b::E;\n",
    )
    .unwrap();
    let found = circles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    // a -> b::c (through the braces), b::c -> a (inline path); b::c's import of its
    // own folder does not count, nor does the commented-out line in b
    assert_eq!(found, vec![vec!["a".to_string(), "b::c".to_string()]]);
}

#[test]
fn a_circle_of_inline_super_paths_is_found() {
    let dir = std::env::temp_dir().join(format!("qw-layers-super-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("q")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod q;\n").unwrap();
    std::fs::write(dir.join("q/mod.rs"), "pub mod x;\npub mod y;\npub mod z;\n").unwrap();
    // x -> y through `super::`, y -> z through `self::super::`, z -> x through a
    // `super::super::` chain back down; no `use` line and no `crate::` anywhere
    std::fs::write(
        dir.join("q/x.rs"),
        "pub fn f() -> u8 { super::y::Y::new().0 }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("q/y.rs"),
        "pub struct Y(pub u8);\nimpl Y { pub fn new() -> Self { Y(self::super::z::G) } }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("q/z.rs"),
        "pub const G: u8 = 1;\nfn g() -> u8 { super::super::q::x::f() }\n\
         mod tests { use super::G; }\n",
    )
    .unwrap();
    let found = circles(&dir);
    // the same files with the circle's last edge gone: no circle
    std::fs::write(dir.join("q/z.rs"), "pub const G: u8 = 1;\n").unwrap();
    let without = circles(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        found,
        vec![vec![
            "q::x".to_string(),
            "q::y".to_string(),
            "q::z".to_string()
        ]]
    );
    assert!(without.is_empty(), "{without:?}");
}
