//! Where a configuration key was set: a line of the `--config` file, an environment
//! variable, or a line of the built-in defaults.
//!
//! The `config` crate merges its sources without keeping positions, so an error is
//! located afterwards: its dotted key (`policies.default.rules[0].window`) is looked
//! up in each source, highest precedence first, in the spanned tables the `toml`
//! crate parses ([`toml::de::DeTable`]).

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

use super::{ConfigError, DEFAULT_TOML};

/// Where the value of a configuration key came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A line (1-based) of the file given with `--config`.
    File {
        /// The file as given.
        path: PathBuf,
        /// Line of the key.
        line: usize,
    },
    /// An environment variable.
    Env {
        /// Its name, e.g. `QUOTA_WORKER__CHANNELS__SMS__RATE`.
        var: String,
    },
    /// A line (1-based) of the built-in `config/default.toml`.
    Default {
        /// Line of the key.
        line: usize,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
            Origin::Env { var } => write!(f, "environment variable {var}"),
            Origin::Default { line } => write!(f, "built-in config/default.toml:{line}"),
        }
    }
}

/// One step of a dotted key: a table key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

/// `policies.default.rules[1].window` → `policies`, `default`, `rules`, `1`, `window`.
fn segments(key: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in key.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Segment::Key(name.to_string()));
        }
        while let Some(inner) = rest.strip_prefix('[') {
            let Some(end) = inner.find(']') else { break };
            match inner[..end].parse() {
                Ok(i) => out.push(Segment::Index(i)),
                Err(_) => out.push(Segment::Key(inner[..end].to_string())),
            }
            rest = &inner[end + 1..];
        }
    }
    out
}

/// The span of the deepest step of `path` found in `table`, and how many steps that was.
fn find(table: &DeTable<'_>, path: &[Segment]) -> Option<(Range<usize>, usize)> {
    let Some((Segment::Key(first), rest)) = path.split_first() else {
        return None;
    };
    let (key, value) = table.iter().find(|(k, _)| k.get_ref() == first)?;
    let here = (key.span(), 1);
    let deeper = match (value.get_ref(), rest.first()) {
        (DeValue::Table(t), Some(Segment::Key(_))) => find(t, rest),
        (DeValue::Array(a), Some(Segment::Index(i))) => a.get(*i).map(|item| {
            let after = &rest[1..];
            match (item.get_ref(), after.is_empty()) {
                (DeValue::Table(t), false) => match find(t, after) {
                    Some((span, n)) => (span, n + 1),
                    None => (item.span(), 1),
                },
                _ => (item.span(), 1),
            }
        }),
        _ => None,
    };
    Some(match deeper {
        Some((span, n)) => (span, n + 1),
        None => here,
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

/// A TOML document and its spanned table.
struct Doc<'a> {
    text: &'a str,
    table: DeTable<'a>,
}

impl<'a> Doc<'a> {
    /// The line of `path`, and whether the whole path was found (else an ancestor's).
    fn line(&self, path: &[Segment]) -> Option<(usize, bool)> {
        let (span, n) = find(&self.table, path)?;
        Some((line_of(self.text, span.start), n == path.len()))
    }
}

/// The sources of one load, for locating its errors.
pub(super) struct Sources<'a> {
    file: Option<(&'a Path, Doc<'a>)>,
    /// Keys the environment sets (dotted, lower-case), with the variable that set each.
    env: BTreeMap<String, String>,
    defaults: Doc<'static>,
}

impl<'a> Sources<'a> {
    /// Parse the file (a syntax error is reported with its line and column) and note
    /// which keys the environment sets (`env_keys`: dotted and lower-case, each with
    /// the variable that set it).
    pub(super) fn new(
        file: Option<(&'a Path, &'a str)>,
        env_keys: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Sources<'a>, ConfigError> {
        let file = match file {
            None => None,
            Some((path, text)) => {
                let table = DeTable::parse(text).map_err(|e| {
                    let at = e.span().map(|s| s.start).unwrap_or(0);
                    let line = line_of(text, at);
                    let line_start = text[..at.min(text.len())]
                        .rfind('\n')
                        .map(|i| i + 1)
                        .unwrap_or(0);
                    ConfigError::Syntax {
                        path: path.to_path_buf(),
                        line,
                        column: text[line_start..at.min(text.len())].chars().count() + 1,
                        message: e.message().trim().replace('\n', "; "),
                    }
                })?;
                Some((
                    path,
                    Doc {
                        text,
                        table: table.into_inner(),
                    },
                ))
            }
        };
        let defaults = Doc {
            text: DEFAULT_TOML,
            table: DeTable::parse(DEFAULT_TOML)
                .expect("config/default.toml is valid TOML")
                .into_inner(),
        };
        Ok(Sources {
            file,
            env: env_keys.into_iter().collect(),
            defaults,
        })
    }

    /// Where the value of `key` was set, highest precedence first: the environment,
    /// the file, the defaults. When no source has the key itself (a value is missing,
    /// or a key depends on another), the nearest enclosing key that a source has.
    pub(crate) fn locate(&self, key: &str) -> Option<Origin> {
        let path = segments(key);
        let env_var = |(_, var): (&String, &String)| Origin::Env { var: var.clone() };
        let env_covers = |(k, _): &(&String, &String)| path.starts_with(&segments(k));
        if let Some(found) = self.env.iter().find(env_covers) {
            return Some(env_var(found));
        }
        let in_file = self
            .file
            .as_ref()
            .and_then(|(p, doc)| doc.line(&path).map(|(line, exact)| (p, line, exact)));
        let in_defaults = self.defaults.line(&path);
        let file_origin = |(p, line, _): (&&Path, usize, bool)| Origin::File {
            path: p.to_path_buf(),
            line,
        };
        if let Some(found @ (_, _, true)) = in_file {
            return Some(file_origin(found));
        }
        if let Some((line, true)) = in_defaults {
            return Some(Origin::Default { line });
        }
        if let Some(found) = self
            .env
            .iter()
            .find(|(k, _)| segments(k).starts_with(&path))
        {
            return Some(env_var(found));
        }
        if let Some(found) = in_file {
            return Some(file_origin(found));
        }
        in_defaults.map(|(line, _)| Origin::Default { line })
    }

    /// `error` with the origin of its key attached, when it has a key and one is found.
    pub(super) fn attach(&self, error: ConfigError) -> ConfigError {
        let origin = error.key().and_then(|k| self.locate(k));
        match origin {
            Some(origin) => ConfigError::At {
                origin,
                error: Box::new(error),
            },
            None => error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_into_segments() {
        assert_eq!(
            segments("policies.default.rules[1].window"),
            vec![
                Segment::Key("policies".into()),
                Segment::Key("default".into()),
                Segment::Key("rules".into()),
                Segment::Index(1),
                Segment::Key("window".into()),
            ]
        );
        assert_eq!(segments("amqp"), vec![Segment::Key("amqp".into())]);
    }

    const FILE: &str = "\
[amqp]
prefetch = 5

[channels.sms]
rate = 0

[policies.default]
rules = [
  { limit = 1, window = \"1d\" },
  { limit = 2, window = \"7x\" },
]

[[policies.weekly.rules]]
limit = 1
window = \"1d\"
";

    fn sources(env: &[&str]) -> Sources<'static> {
        Sources::new(
            Some((Path::new("c.toml"), FILE)),
            env.iter().map(|k| {
                let var = format!("QUOTA_WORKER__{}", k.replace('.', "__").to_uppercase());
                (k.to_string(), var)
            }),
        )
        .unwrap()
    }

    fn file_line(origin: Option<Origin>) -> usize {
        match origin {
            Some(Origin::File { line, .. }) => line,
            other => panic!("expected a file line, got {other:?}"),
        }
    }

    #[test]
    fn keys_in_the_file_give_their_line() {
        let s = sources(&[]);
        assert_eq!(file_line(s.locate("amqp.prefetch")), 2);
        assert_eq!(file_line(s.locate("channels.sms.rate")), 5);
        assert_eq!(file_line(s.locate("channels.sms")), 4);
        assert_eq!(file_line(s.locate("policies.default.rules[1].window")), 10);
        assert_eq!(file_line(s.locate("policies.default.rules[0]")), 9);
        assert_eq!(file_line(s.locate("policies.weekly.rules[0].window")), 15);
        // Not in the file, but its channel is: the channel's line.
        assert_eq!(file_line(s.locate("channels.sms.burst")), 4);
    }

    #[test]
    fn other_keys_come_from_the_environment_or_the_defaults() {
        let s = sources(&["redis.url", "channels.fax.rate"]);
        assert_eq!(
            s.locate("redis.url"),
            Some(Origin::Env {
                var: "QUOTA_WORKER__REDIS__URL".into()
            })
        );
        // A channel only the environment defines.
        assert_eq!(
            s.locate("channels.fax"),
            Some(Origin::Env {
                var: "QUOTA_WORKER__CHANNELS__FAX__RATE".into()
            })
        );
        let Some(Origin::Default { line }) = s.locate("worker.default_timezone") else {
            panic!("expected the defaults");
        };
        assert!(DEFAULT_TOML
            .lines()
            .nth(line - 1)
            .unwrap()
            .starts_with("default_timezone"));
        assert_eq!(s.locate("nothing.here"), None);
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let text = "[amqp]\nprefetch = = 5\n";
        let Err(ConfigError::Syntax { line, column, .. }) =
            Sources::new(Some((Path::new("c.toml"), text)), Vec::new())
        else {
            panic!("expected a syntax error");
        };
        assert_eq!((line, column), (2, 12));
    }
}
