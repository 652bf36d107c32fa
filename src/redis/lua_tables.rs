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
                    let lua = std::fs::read_to_string(&path).unwrap();
                    found.extend(positional_returns(&path.display().to_string(), &lua));
                    scripts += 1;
                }
            }
        }
        assert!(scripts > 20, "only {scripts} scripts found");
        assert!(found.is_empty(), "{found:#?}");
    }
}
