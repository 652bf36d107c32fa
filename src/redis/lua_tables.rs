//! What the tests of the scripts' protocols share: a script's table of names read
//! out of its source, so that a test can check that the script and its Rust reader
//! give each name the same number, and the check that a script answers by name.

/// The `NAME = { key = number, ... }` table of `lua`, as (key, number) pairs.
pub(crate) fn lua_table(lua: &str, name: &str) -> Vec<(String, i64)> {
    let open = format!("local {name} = {{");
    let start = lua.find(&open).unwrap_or_else(|| panic!("no table {name}")) + open.len();
    let body = &lua[start..start + lua[start..].find("\n}").expect("the table's end")];
    body.lines()
        .map(|line| line.split("--").next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (key, value) = line.trim_end_matches(',').split_once('=').expect(line);
            (key.trim().to_string(), value.trim().parse().expect(line))
        })
        .collect()
}

/// Assert that `lua` (named `script`) and its reader's `codes` give each name of its
/// table `table` the same number, and that the script answers by name.
pub(crate) fn speaks_by_name(script: &str, lua: &str, table: &str, codes: &[(i64, &str)]) {
    let ours: Vec<(String, i64)> = codes.iter().map(|(c, n)| (n.to_string(), *c)).collect();
    assert_eq!(lua_table(lua, table), ours, "{script}");
    let found = positional_returns(script, lua);
    assert!(found.is_empty(), "{found:#?}");
}

/// The lines of `lua` (named `script`) that return a literal array or number
/// instead of naming what they answer (`return {1, ...}`, `return {'2', ...}`,
/// `return 0`): empty when the script answers by name.
pub(crate) fn positional_returns(script: &str, lua: &str) -> Vec<String> {
    let literal = |what: &str| {
        let what = what.trim_start_matches('{').trim_start();
        what.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '\'')
    };
    lua.lines()
        .filter(|line| {
            let code = line.split("--").next().unwrap_or("");
            code.match_indices("return ").any(|(at, word)| {
                let before = code[..at].chars().next_back();
                before.is_none_or(|c| !c.is_alphanumeric() && c != '_')
                    && literal(&code[at + word.len()..])
            })
        })
        .map(|line| format!("{script}: {line}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::positional_returns;

    /// The lines of a script that can give its answer: every line outside its
    /// top-level functions (`local function f(...)` to the `end` at the start of a
    /// line), whose returns are values to the script itself, not its reply.
    fn answers_of(lua: &str) -> String {
        let mut inside = false;
        let mut out = String::new();
        for line in lua.lines() {
            if line.starts_with("local function ") || line.starts_with("function ") {
                inside = true;
            } else if inside && line.starts_with("end") {
                inside = false;
            } else if !inside {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// No script of the crate answers by position: every `return` of every script
    /// in `lua/` and `src/admission/lua/` names what it answers (a code of its
    /// table, a value it computed), never a literal number, string or array.
    #[test]
    fn no_script_answers_by_position() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut found = Vec::new();
        let mut scripts = 0;
        for dir in ["lua", "src/admission/lua"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "lua") {
                    let lua = answers_of(&std::fs::read_to_string(&path).unwrap());
                    found.extend(positional_returns(&path.display().to_string(), &lua));
                    scripts += 1;
                }
            }
        }
        assert!(scripts > 20, "only {scripts} scripts found");
        assert!(found.is_empty(), "{found:#?}");
    }
}
