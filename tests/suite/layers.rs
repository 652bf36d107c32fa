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
    imports_at(text, module).into_keys().collect()
}

/// [`imports`], each with the line (from 1) where the file first names it.
fn imports_at(text: &str, module: &[String]) -> BTreeMap<Module, usize> {
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
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = BTreeMap::new();
    let mut add = |path: Module, at: usize| {
        out.entry(path).or_insert_with(|| line_of(at));
    };
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
                        add([head.clone(), split(item)].concat(), start);
                    }
                }
                add(head, start);
            }
            None => {
                let path = [head, split(body.split(" as ").next().unwrap_or(""))].concat();
                add(path, start);
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
                add([head, split(rest.trim_end_matches(':'))].concat(), start);
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

/// The layers `lib.rs` states under "## Layers", bottom first: each row's name and
/// the module paths its modules cell names in code spans (`[`quota`]`, `cli`); words
/// that are not module paths (`src/main.rs`, prose) are passed over.
fn stated_layers(lib: &str) -> Vec<(String, Vec<Module>)> {
    let is_path = |s: &str| {
        !s.is_empty()
            && s.split("::")
                .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    };
    let rows = lib
        .lines()
        .map(|l| l.trim_start_matches("//!").trim())
        .skip_while(|l| *l != "## Layers")
        .skip_while(|l| !l.starts_with("|---"))
        .skip(1)
        .take_while(|l| l.starts_with('|'));
    rows.map(|row| {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let spans = cells[2].split('`').skip(1).step_by(2);
        let named = spans
            .filter(|s| is_path(s))
            .map(|s| s.split("::").map(String::from).collect())
            .collect();
        (cells[1].to_string(), named)
    })
    .collect()
}

/// Every breach of the stated layers in the crate at `src`: a row naming no module,
/// a module named in two rows, a file in no layer, and an import (by file and line)
/// of a module in a higher layer than the importing file's. A file's layer is that of
/// the longest module path a row names that contains it.
fn layer_breaches(src: &Path, lib: &str) -> Vec<String> {
    let files = modules(src);
    let resolve = |path: &Module| {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|p| files.contains_key(p))
    };
    let rows = stated_layers(lib);
    let mut breaches = Vec::new();
    let mut named: BTreeMap<Module, usize> = BTreeMap::new();
    for (layer, (name, paths)) in rows.iter().enumerate() {
        for path in paths {
            match resolve(path) {
                None => breaches.push(format!(
                    "the {name} row names `{}`, no module",
                    path.join("::")
                )),
                Some(m) => match named.insert(m.clone(), layer) {
                    Some(other) if other != layer => breaches.push(format!(
                        "`{}` is named in two rows: {} and {name}",
                        m.join("::"),
                        rows[other].0
                    )),
                    _ => {}
                },
            }
        }
    }
    let layer_of = |module: &Module| {
        (1..=module.len())
            .rev()
            .find_map(|k| named.get(&module[..k]).copied())
    };
    let shown = |path: &Path| {
        path.strip_prefix(src.parent().unwrap())
            .unwrap_or(path)
            .display()
            .to_string()
    };
    for (module, path) in &files {
        let Some(mine) = layer_of(module) else {
            breaches.push(format!("{} sits in no layer of the table", shown(path)));
            continue;
        };
        let text = std::fs::read_to_string(path).unwrap();
        for (import, line) in imports_at(&text, module) {
            let Some(target) = resolve(&import) else {
                continue;
            };
            if &target == module || module.starts_with(&target) {
                continue;
            }
            match layer_of(&target) {
                Some(theirs) if theirs > mine => breaches.push(format!(
                    "{}:{line} ({}) imports `{}` ({}), a layer above it",
                    shown(path),
                    rows[mine].0,
                    target.join("::"),
                    rows[theirs].0
                )),
                _ => {}
            }
        }
    }
    breaches
}

#[test]
fn every_import_goes_down_the_layers_that_lib_rs_states() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(
        stated_layers(&lib).len() > 5,
        "lib.rs states no layer table"
    );
    let breaches = layer_breaches(&root.join("src"), &lib);
    assert!(
        breaches.is_empty(),
        "imports the layer table of src/lib.rs does not allow:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn the_layer_check_finds_an_upward_import_and_a_file_in_no_layer() {
    let dir = std::env::temp_dir().join(format!("qw-layers-up-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("room")).unwrap();
    let lib = "//! ## Layers\n//! | layer | modules | I/O |\n//! |---|---|---|\n\
               //! | low | [`base`], the room's pure file [`room::pure`] | no |\n\
               //! | high | [`top`], `room` | all |\n";
    std::fs::write(src.join("base.rs"), "pub struct B;\n").unwrap();
    std::fs::write(src.join("top.rs"), "use crate::base::B;\n").unwrap();
    std::fs::write(src.join("room/mod.rs"), "pub mod pure;\n").unwrap();
    // a pure file naming its own room's mod.rs (an ancestor) is no breach
    std::fs::write(src.join("room/pure.rs"), "use super::X;\n").unwrap();
    let clean = layer_breaches(&src, lib);
    // low naming high inline, on its third line; and a file no row names
    std::fs::write(
        src.join("base.rs"),
        "pub struct B;\n\nfn f() { crate::top::g() }\n",
    )
    .unwrap();
    std::fs::write(src.join("stray.rs"), "").unwrap();
    let found = layer_breaches(&src, lib);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(clean.is_empty(), "{clean:?}");
    assert_eq!(
        found,
        vec![
            "src/base.rs:3 (low) imports `top` (high), a layer above it".to_string(),
            "src/stray.rs sits in no layer of the table".to_string(),
        ]
    );
}
