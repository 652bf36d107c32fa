//! `config.md`: every configuration key with its type, default and doc comment. The
//! keys and their doc comments are read from the configuration types (the structs
//! of `src/config/`, walked from `Settings` as serde names them), the defaults from
//! `Settings::defaults()` serialized. A table of named entries (`[policies.NAME]`)
//! has its entries' keys under `NAME`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use super::source::{attr_value, one_line, serde_name, Types};

/// One key of the configuration.
#[derive(Debug, Clone)]
pub struct Key {
    /// `amqp.url`, `policies.NAME.rules`.
    pub path: String,
    pub ty: String,
    pub default: String,
    pub docs: String,
}

/// Keys the configuration types have that their section refuses (its validation
/// names the key), with why; `a_refused_key_is_refused` checks each.
pub const REFUSED: &[(&str, &str)] = &[(
    "redis.tls.server_name",
    "Refused: a Redis server's certificate is verified against the host of its URL.",
)];

/// The top-level sections: (name, the doc of its `Settings` field).
pub type Sections = Vec<(String, String)>;

fn types(root: &Path) -> Types {
    // the configuration's own types first, then the ones its keys take (TLS, the
    // policies' words, the job's priority), then anything else in src/
    Types::read(
        root,
        &["src/config", "src/quota", "producer/src"],
        &["src/tls.rs"],
        Some("src"),
    )
}

/// Every key, in the order of the types' fields, and the sections.
pub fn keys(root: &Path) -> (Vec<Key>, Sections) {
    let types = types(root);
    let defaults = toml::Value::try_from(quota_worker::config::Settings::defaults())
        .expect("the defaults serialize");
    let mut walker = Walker {
        types: &types,
        out: Vec::new(),
        entries: BTreeMap::new(),
    };
    let mut sections = Vec::new();
    for f in &types.structs["Settings"].1 {
        let name = attr_value(&f.attrs, "rename").unwrap_or_else(|| f.name.clone());
        sections.push((name.clone(), one_line(&types.resolve(&f.docs))));
        let at = Place {
            path: name.clone(),
            default: defaults.get(&name),
            fixed: true,
        };
        walker.walk(&f.ty, &f.attrs, &f.docs, at);
    }
    (walker.out, sections)
}

/// The type inside `Wrapper<…>`, if `ty` is one.
fn inner<'a>(ty: &'a str, wrapper: &str) -> Option<&'a str> {
    ty.strip_prefix(wrapper)?
        .strip_prefix('<')?
        .strip_suffix('>')
}

/// Where a key is: its path, its default, and whether it is a fixed key (not one of
/// a named entry's, which have no default of their own).
struct Place<'a> {
    path: String,
    default: Option<&'a toml::Value>,
    fixed: bool,
}

struct Walker<'t> {
    types: &'t Types,
    out: Vec<Key>,
    /// The entry types of the named tables walked so far, and where.
    entries: BTreeMap<String, String>,
}

impl Walker<'_> {
    fn walk(&mut self, ty: &str, attrs: &str, docs: &str, at: Place<'_>) {
        let (ty, optional) = match inner(ty, "Option") {
            Some(t) => (t, true),
            None => (ty, false),
        };
        if let Some(entry) = inner(ty, "BTreeMap").and_then(|t| t.strip_prefix("String, ")) {
            let names = match at.default.and_then(|d| d.as_table()) {
                Some(t) if !t.is_empty() => {
                    let names: Vec<String> = t.keys().map(|k| format!("`{k}`")).collect();
                    names.join(", ")
                }
                _ => "none".into(),
            };
            let seen = self.entries.get(entry).cloned();
            self.out.push(Key {
                path: at.path.clone(),
                ty: match &seen {
                    Some(other) => format!("table of named entries, each as `{other}`"),
                    None => "table of named entries".into(),
                },
                default: if at.fixed { names } else { "optional".into() },
                docs: one_line(&self.types.resolve(docs)),
            });
            if seen.is_none() {
                let path = format!("{}.NAME", at.path);
                self.entries.insert(entry.to_string(), path.clone());
                let place = Place {
                    path,
                    default: None,
                    fixed: false,
                };
                // an entry that is one value (a token) says what it is here; an entry
                // that is a table has its keys' own docs
                let one = format!("One entry of `{}`, under its name.", at.path);
                self.walk(entry, "", &one, place);
            }
            return;
        }
        if let Some((_, fields)) = self.types.structs.get(ty) {
            for f in fields {
                let name = attr_value(&f.attrs, "rename").unwrap_or_else(|| f.name.clone());
                let place = Place {
                    path: format!("{}.{name}", at.path),
                    default: at.default.and_then(|d| d.get(&name)),
                    fixed: at.fixed,
                };
                self.walk(&f.ty, &f.attrs, &f.docs, place);
            }
            return;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| *k == at.path) {
            self.out.push(Key {
                path: at.path,
                ty: type_name(self.types, ty),
                default: "refused".into(),
                docs: why.to_string(),
            });
            return;
        }
        // a secret's default is serialized as the worker prints it (`<redacted>`, or
        // empty when it is empty)
        let default = if at.fixed {
            match at.default {
                Some(v) => value(v),
                None => "unset".into(),
            }
        } else if optional || attrs.contains("default") {
            "optional".into()
        } else {
            "required".into()
        };
        self.out.push(Key {
            path: at.path,
            ty: type_name(self.types, ty),
            default,
            docs: one_line(&self.types.resolve(docs)),
        });
    }
}

/// A value as TOML writes it inline.
fn value(v: &toml::Value) -> String {
    let text = match v {
        toml::Value::Table(t) if t.is_empty() => "{}".to_string(),
        other => other.to_string(),
    };
    format!("`{}`", text.replace('|', "\\|"))
}

/// What a value of Rust type `ty` is written as.
fn type_name(types: &Types, ty: &str) -> String {
    if let Some(t) = inner(ty, "Vec") {
        return format!("list of {}", type_name(types, t));
    }
    match ty {
        "String" => "string".into(),
        "bool" => "boolean".into(),
        "u8" | "u16" | "u32" | "u64" | "usize" | "i32" | "i64" => "integer".into(),
        "f64" => "number".into(),
        "Dur" => "duration (`500ms`, `30s`, `10m`, `24h`)".into(),
        "Tz" => "IANA time zone".into(),
        "Window" => "window (`30s`, `24h`: rolling; `1d`, `7d`: calendar days)".into(),
        "SendWindows" => "list of `{ days, from, to }`".into(),
        "SecretString" => "string (secret)".into(),
        "PathBuf" => "path".into(),
        "RuleSettings" => "`{ limit, window }`".into(),
        "LanePrefetch" => "`\"auto\"` or an integer (1 to 65535)".into(),
        other => match types.enums.get(other) {
            Some((item, _)) if !item.attrs.contains("Deserialize") => panic!(
                "`{other}` deserializes by hand, so its variants are not what a user \
                 writes: say how it is written in `type_name`"
            ),
            Some((item, variants)) => {
                let all = attr_value(&item.attrs, "rename_all");
                let words: Vec<String> = variants
                    .iter()
                    .map(|v| format!("`\"{}\"`", serde_name(v, all.as_deref())))
                    .collect();
                format!("one of {}", words.join(", "))
            }
            None => format!("`{other}`"),
        },
    }
}

/// The page.
pub fn page(root: &Path) -> String {
    let (keys, sections) = keys(root);
    let mut o = String::from(
        "# Configuration\n\n\
         <!-- Generated from the configuration types (src/config/) by the suite's \
         `reference` tests; do not edit (see README.md here). -->\n\n\
         Every key the worker reads, with its type, its default and what it does. The \
         worker reads the built-in defaults ([config/default.toml](../../config/default.toml), \
         commented), then the file given with `--config`, then environment variables \
         `QUOTA_WORKER__SECTION__KEY` (e.g. `QUOTA_WORKER__REDIS__URL`). A table of named \
         entries (`[policies.NAME]`) lists its entries' keys under `NAME`; there an entry's \
         key is *required* or *optional* (its default is in its description).\n\n",
    );
    for (name, docs) in &sections {
        let _ = writeln!(o, "- [`{name}`](#{name}): {docs}");
    }
    for (name, docs) in &sections {
        let _ = write!(o, "\n## {name}\n\n{docs}\n\n");
        o.push_str("| Key | Type | Default | Description |\n|---|---|---|---|\n");
        for k in keys
            .iter()
            .filter(|k| k.path == *name || k.path.starts_with(&format!("{name}.")))
        {
            let _ = writeln!(
                o,
                "| `{}` | {} | {} | {} |",
                k.path, k.ty, k.default, k.docs
            );
        }
    }
    o
}
