//! `quota-worker reference DIR` (hidden): the command-line reference written from
//! the binary's own clap definition, so it cannot drift: `DIR/cli.md` (every
//! command with its usage, arguments and flags) and a man page a command in
//! `DIR/man/`. The other references (configuration, metrics, dead letters,
//! schemas) are written from the library by the suite's `reference` tests, which
//! also run this and compare every page with the one checked in.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use clap::{Arg, Command};

/// Write `cli.md` and the man pages of `cli` (the binary's whole command) into `dir`.
pub fn write(mut cli: Command, dir: &Path) -> anyhow::Result<()> {
    cli.build();
    let man = dir.join("man");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    let mut page = String::from(
        "# Command line\n\n\
         <!-- Generated from the binary's clap definition by `quota-worker reference`; \
         do not edit (see README.md here). -->\n\n\
         Every command of `quota-worker`, its arguments and flags, as `--help` prints \
         them. Each also has a man page in [man/](man/).\n",
    );
    let mut commands = Vec::new();
    visible(&cli, &mut commands);
    page.push_str("\n| Command | What it does |\n|---|---|\n");
    for c in &commands {
        let _ = writeln!(
            page,
            "| [`{}`](#{}) | {} |",
            path(c),
            anchor(&path(c)),
            cell(&about(c))
        );
    }
    for c in &commands {
        section(c, &mut page);
        let mut text = Vec::new();
        clap_mangen::Man::new((*c).clone())
            .source(format!("quota-worker {}", env!("CARGO_PKG_VERSION")))
            .manual("quota-worker")
            .render(&mut text)?;
        let file = man.join(format!("{}.1", path(c).replace(' ', "-")));
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    let file = dir.join("cli.md");
    std::fs::write(&file, page).with_context(|| format!("writing {}", file.display()))?;
    Ok(())
}

/// `c` and its subcommands, depth first, less the hidden ones and `help`.
fn visible<'a>(c: &'a Command, out: &mut Vec<&'a Command>) {
    out.push(c);
    for sub in c.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            visible(sub, out);
        }
    }
}

/// The command as typed: `quota-worker admin dead list`.
fn path(c: &Command) -> String {
    c.get_bin_name().unwrap_or(c.get_name()).to_string()
}

fn anchor(title: &str) -> String {
    title
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn about(c: &Command) -> String {
    c.get_about().map(|a| a.to_string()).unwrap_or_default()
}

/// A table cell: one line, no `|`.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

fn section(c: &Command, page: &mut String) {
    let _ = write!(page, "\n## {}\n\n", path(c));
    let long = c
        .get_long_about()
        .or(c.get_about())
        .map(|a| a.to_string())
        .unwrap_or_default();
    if !long.is_empty() {
        let _ = write!(page, "{long}\n\n");
    }
    let usage = c.clone().render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ");
    let _ = write!(page, "```text\n{usage}\n```\n");
    // every flag the command accepts, the global ones (propagated by `build`) and
    // `--help` included, as its man page and `--help` list them
    let args: Vec<&Arg> = c.get_arguments().filter(|a| !a.is_hide_set()).collect();
    if !args.is_empty() {
        page.push_str("\n| Argument | Default | Environment | Meaning |\n|---|---|---|---|\n");
    }
    for a in args {
        let _ = writeln!(
            page,
            "| {} | {} | {} | {} |",
            name(a),
            default(a),
            a.get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default(),
            cell(&meaning(a))
        );
    }
    let subs: Vec<&Command> = c
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    if !subs.is_empty() {
        page.push_str("\nSubcommands: ");
        let links: Vec<String> = subs
            .iter()
            .map(|s| format!("[`{}`](#{})", s.get_name(), anchor(&path(s))))
            .collect();
        page.push_str(&links.join(", "));
        page.push('\n');
    }
}

/// `--flag <VALUE>`, `-s, --flag`, or `<NAME>` for a positional argument.
fn name(a: &Arg) -> String {
    let value = || {
        a.get_value_names()
            .map(|v| {
                v.iter()
                    .map(|n| format!("<{n}>"))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| format!("<{}>", a.get_id().as_str().to_uppercase()))
    };
    if a.is_positional() {
        return format!("`{}`", value());
    }
    let mut words = Vec::new();
    if let Some(s) = a.get_short() {
        words.push(format!("-{s}"));
    }
    if let Some(l) = a.get_long() {
        words.push(format!("--{l}"));
    }
    let takes_value = a.get_num_args().is_some_and(|n| n.takes_values())
        && !matches!(
            a.get_action(),
            clap::ArgAction::SetTrue | clap::ArgAction::SetFalse | clap::ArgAction::Count
        );
    let mut out = words.join(", ");
    if takes_value {
        out = format!("{out} {}", value());
    }
    format!("`{out}`")
}

fn default(a: &Arg) -> String {
    let values: Vec<String> = a
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() || values == ["false"] {
        return String::new();
    }
    format!("`{}`", values.join(" "))
}

/// Its help, with the values it accepts when they are a closed set.
fn meaning(a: &Arg) -> String {
    let help = a
        .get_long_help()
        .or(a.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let values: Vec<String> = a
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| match v.get_help() {
            Some(h) => format!(
                "`{}` ({})",
                v.get_name(),
                h.to_string().trim_end_matches('.')
            ),
            None => format!("`{}`", v.get_name()),
        })
        .collect();
    if values.is_empty() || !a.get_action().takes_values() {
        return help;
    }
    format!(
        "{}: one of {}",
        help.trim_end_matches('.'),
        values.join(", ")
    )
}
