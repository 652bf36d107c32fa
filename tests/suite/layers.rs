//! The layers only look down: no import circle between the source files of any crate
//! of the workspace. A file's imports are the `crate::a::b` paths it names (in `use`
//! lines and inline); each resolves to the longest module path that is a file, and a
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

/// Every `crate::…` path a file names, with `use crate::a::{b, c::d}` expanded.
fn imports(text: &str) -> BTreeSet<Module> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = BTreeSet::new();
    let split = |s: &str| -> Module {
        s.split("::")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect()
    };
    let mut rest = code.as_str();
    while let Some(at) = rest.find("use crate::") {
        let body = &rest[at + "use crate::".len()..];
        let end = body.find(';').unwrap_or(body.len());
        let body = &body[..end];
        match body.split_once('{') {
            Some((head, items)) => {
                let head = split(head);
                for item in items.split([',', '{', '}']) {
                    let item = item.split(" as ").next().unwrap_or("").trim();
                    if !item.is_empty() && item != "self" {
                        out.insert([head.clone(), split(item)].concat());
                    }
                }
                out.insert(head);
            }
            None => {
                out.insert(split(body.split(" as ").next().unwrap_or("")));
            }
        }
        rest = &body[end.min(body.len())..];
    }
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(at) = code[from..].find("crate::") {
        let start = from + at;
        let word_before =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let path: String = code[start + "crate::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        if !word_before {
            out.insert(split(path.trim_end_matches(':')));
        }
        from = start + "crate::".len();
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
            let targets = imports(&text)
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
