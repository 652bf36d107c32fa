//! Reading the definitions the references are written from out of the Rust sources:
//! each item with its doc comment and attributes, the fields of structs and the
//! variants of enums, and `const NAME: &str = "value";` lines. Text only, as the
//! sources are written here (one field, variant or constant a line).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One line of code with the doc comment and the attributes above it.
#[derive(Debug, Clone, Default)]
pub struct Item {
    pub docs: String,
    pub attrs: String,
    pub line: String,
}

/// The code lines of `text`, each with its doc comment (the `///` lines joined,
/// paragraphs kept apart by an empty line) and its attributes.
pub fn items(text: &str) -> Vec<Item> {
    let mut out = Vec::new();
    let mut docs: Vec<String> = Vec::new();
    let mut attrs = String::new();
    let mut open = 0i32;
    for raw in text.lines() {
        let line = raw.trim();
        if open > 0 || line.starts_with("#[") {
            attrs.push_str(line);
            attrs.push(' ');
            open += line.matches('[').count() as i32 - line.matches(']').count() as i32;
            continue;
        }
        if let Some(doc) = line.strip_prefix("///") {
            docs.push(doc.strip_prefix(' ').unwrap_or(doc).to_string());
            continue;
        }
        if line.is_empty() || line.starts_with("//") {
            continue;
        }
        out.push(Item {
            docs: docs.join("\n"),
            attrs: std::mem::take(&mut attrs),
            line: line.to_string(),
        });
        docs.clear();
    }
    out
}

/// A doc comment as one line of Markdown: paragraphs joined. An intra-doc link
/// (`` [`X`] ``) is left as it is: a page must not hold one, so one that reaches a
/// page fails `reference::pages` (resolve those to constants with
/// [`Types::resolve`] first).
pub fn one_line(docs: &str) -> String {
    docs.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// A field of a struct.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    pub ty: String,
    pub docs: String,
    pub attrs: String,
}

/// A variant of an enum.
#[derive(Debug, Clone)]
pub struct Variant {
    pub name: String,
    pub docs: String,
    pub attrs: String,
}

/// The structs and enums of some source files, by name.
#[derive(Debug, Default)]
pub struct Types {
    pub structs: BTreeMap<String, (Item, Vec<Field>)>,
    pub enums: BTreeMap<String, (Item, Vec<Variant>)>,
    /// `const NAME: T = literal;` (a string or a number), by name: the literal as a
    /// user writes the value (a string without its quotes).
    pub consts: BTreeMap<String, String>,
}

impl Types {
    /// Read the single `files`, then every `.rs` file of `dirs` (not below them),
    /// then, with `rest`, every other file below `rest`: where two types share a
    /// name, the first read is the one.
    pub fn read(root: &Path, dirs: &[&str], files: &[&str], rest: Option<&str>) -> Types {
        let rust = |p: &Path| p.extension().is_some_and(|e| e == "rs");
        let mut paths: Vec<PathBuf> = files.iter().map(|f| root.join(f)).collect();
        for dir in dirs {
            let mut found: Vec<_> = std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| rust(p))
                .collect();
            found.sort();
            paths.extend(found);
        }
        if let Some(dir) = rest {
            let mut stack = vec![root.join(dir)];
            let mut found = Vec::new();
            while let Some(dir) = stack.pop() {
                for path in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
                    if path.is_dir() {
                        stack.push(path);
                    } else if rust(&path) && !paths.contains(&path) {
                        found.push(path);
                    }
                }
            }
            found.sort();
            paths.extend(found);
        }
        let mut types = Types::default();
        for path in paths {
            types.add(&std::fs::read_to_string(&path).unwrap());
        }
        types
    }

    /// `docs` with each intra-doc link to a constant (`` [`REDACTED`] ``,
    /// `` [`crate::quota::prefetch::AUTO_CEILING`] ``) written as the constant's
    /// value in code (`` `<redacted>` ``, `` `1024` ``); other links stay as they are.
    pub fn resolve(&self, docs: &str) -> String {
        let mut out = String::new();
        let mut rest = docs;
        while let Some(at) = rest.find("[`") {
            out.push_str(&rest[..at]);
            let link = &rest[at + 2..];
            let Some(end) = link.find("`]") else {
                out.push_str(&rest[at..]);
                return out;
            };
            let name = link[..end].rsplit("::").next().unwrap_or_default();
            match self.consts.get(name) {
                Some(value) => out.push_str(&format!("`{value}`")),
                None => out.push_str(&rest[at..at + 2 + end + 2]),
            }
            rest = &link[end + 2..];
        }
        out.push_str(rest);
        out
    }

    fn add(&mut self, text: &str) {
        let items = items(text);
        for (name, value) in literal_consts(&items) {
            self.consts.entry(name).or_insert(value);
        }
        let mut i = 0;
        while i < items.len() {
            let item = &items[i];
            let head = item
                .line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            let name = |rest: &str| -> String {
                rest.chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            };
            if let Some(rest) = head
                .strip_prefix("struct ")
                .filter(|_| item.line.ends_with('{'))
            {
                let (fields, next) = Self::fields(&items, i + 1);
                self.structs
                    .entry(name(rest))
                    .or_insert((item.clone(), fields));
                i = next;
                continue;
            }
            if let Some(rest) = head
                .strip_prefix("enum ")
                .filter(|_| item.line.ends_with('{'))
            {
                let (variants, next) = Self::variants(&items, i + 1);
                self.enums
                    .entry(name(rest))
                    .or_insert((item.clone(), variants));
                i = next;
                continue;
            }
            i += 1;
        }
    }

    fn fields(items: &[Item], from: usize) -> (Vec<Field>, usize) {
        let mut out = Vec::new();
        let mut i = from;
        while i < items.len() && items[i].line != "}" {
            let line = items[i].line.trim_start_matches("pub(crate) ");
            if let Some((name, ty)) = line.strip_prefix("pub ").and_then(|l| l.split_once(": ")) {
                out.push(Field {
                    name: name.to_string(),
                    ty: ty.trim_end_matches(',').to_string(),
                    docs: items[i].docs.clone(),
                    attrs: items[i].attrs.clone(),
                });
            }
            i += 1;
        }
        (out, i + 1)
    }

    fn variants(items: &[Item], from: usize) -> (Vec<Variant>, usize) {
        let mut out = Vec::new();
        let mut depth = 1i32;
        let mut i = from;
        while i < items.len() {
            let line = &items[i].line;
            if depth == 1 && line.starts_with(|c: char| c.is_ascii_uppercase()) {
                out.push(Variant {
                    name: line
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect(),
                    docs: items[i].docs.clone(),
                    attrs: items[i].attrs.clone(),
                });
            }
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            i += 1;
            if depth <= 0 {
                break;
            }
        }
        (out, i)
    }
}

/// The value of `key = "value"` in an attribute (`#[serde(rename = "match")]`).
pub fn attr_value(attrs: &str, key: &str) -> Option<String> {
    let at = attrs.find(&format!("{key} = \""))?;
    let rest = &attrs[at + key.len() + 4..];
    Some(rest[..rest.find('"')?].to_string())
}

/// A variant's name as serde writes it under the enum's `rename_all`.
pub fn serde_name(variant: &Variant, rename_all: Option<&str>) -> String {
    if let Some(name) = attr_value(&variant.attrs, "rename") {
        return name;
    }
    let snake = || {
        let mut out = String::new();
        for (i, c) in variant.name.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    };
    match rename_all {
        Some("lowercase") => variant.name.to_lowercase(),
        Some("snake_case") => snake(),
        Some("kebab-case") => snake().replace('_', "-"),
        _ => variant.name.clone(),
    }
}

/// Every `const NAME: &str = "value";` of a file (any visibility), with its doc.
pub fn str_consts(text: &str) -> Vec<(String, String, String)> {
    items(text)
        .into_iter()
        .filter_map(|item| {
            let line = item
                .line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub ");
            let rest = line.strip_prefix("const ")?;
            let (name, rest) = rest.split_once(": &str = \"")?;
            let value = rest.strip_suffix("\";")?;
            Some((name.to_string(), value.to_string(), item.docs))
        })
        .collect()
}

/// The `const NAME: T = literal;` lines of `items` whose literal is a string (its
/// text, unquoted) or a number (its digits, `_` dropped).
fn literal_consts(items: &[Item]) -> Vec<(String, String)> {
    items
        .iter()
        .filter_map(|item| {
            let line = item
                .line
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            let (name, rest) = line.strip_prefix("const ")?.split_once(": ")?;
            let value = rest.split_once(" = ")?.1.strip_suffix(';')?;
            let value = match value.strip_prefix('"') {
                Some(text) => text.strip_suffix('"')?.to_string(),
                None if value.chars().all(|c| c.is_ascii_digit() || c == '_') => {
                    value.replace('_', "")
                }
                None => return None,
            };
            Some((name.to_string(), value))
        })
        .collect()
}
