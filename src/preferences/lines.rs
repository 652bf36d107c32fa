//! The lines of `admin preferences export` and `import` (JSON lines): one object
//! a line, `{"recipient", "tenant", "preferences": {...}, "updated_at"}`. Pure: a
//! line written from a stored set ([`write_line`]) and a line read back, checked
//! whole with the parser the HTTP API uses ([`parse_line`]); a refusal names its
//! field (`preferences.quiet_hours.windows[0].from`).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::Value;

use super::set::{Invalid, Preferences};

/// One line read back: whose set, the set, and when it was last changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// The recipient, as producers write it.
    pub recipient: String,
    /// Its tenant (`None`: no tenant).
    pub tenant: Option<String>,
    /// The set, checked.
    pub preferences: Preferences,
    /// When it was last changed (`None`: not said; the import stores it as now).
    pub updated_at: Option<DateTime<Utc>>,
}

#[derive(Serialize)]
struct Written<'a> {
    recipient: &'a str,
    tenant: Option<&'a str>,
    preferences: &'a Value,
    updated_at: String,
}

/// The line of one stored set (without its newline): `preferences` as stored,
/// `updated_at` in RFC 3339 with milliseconds, as `GET` shows it.
pub fn write_line(
    recipient: &str,
    tenant: Option<&str>,
    preferences: &Value,
    updated_at: DateTime<Utc>,
) -> String {
    serde_json::to_string(&Written {
        recipient,
        tenant,
        preferences,
        updated_at: updated_at.to_rfc3339_opts(SecondsFormat::Millis, true),
    })
    .expect("a JSON value serialises")
}

fn invalid(field: &str, error: impl Into<String>) -> Invalid {
    Invalid {
        error: error.into(),
        field: field.into(),
    }
}

/// `text` read as one line, checked whole: the set by [`Preferences::parse`] (its
/// fields prefixed `preferences.`), channels by `channel_known`.
pub fn parse_line(text: &str, channel_known: &dyn Fn(&str) -> bool) -> Result<Line, Invalid> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| invalid("", format!("not JSON: {e}")))?;
    let top = value
        .as_object()
        .ok_or_else(|| invalid("", "must be an object"))?;
    if let Some(other) = top
        .keys()
        .find(|k| !["recipient", "tenant", "preferences", "updated_at"].contains(&k.as_str()))
    {
        return Err(invalid(other, format!("unknown key `{other}`")));
    }
    let recipient = match top.get("recipient") {
        Some(Value::String(r)) if !r.is_empty() => r.clone(),
        _ => return Err(invalid("recipient", "is required, a non-empty string")),
    };
    let tenant = match top.get("tenant") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) if !t.is_empty() => Some(t.clone()),
        Some(_) => return Err(invalid("tenant", "must be a non-empty string or null")),
    };
    let preferences = top
        .get("preferences")
        .ok_or_else(|| invalid("preferences", "is required, an object"))?;
    let preferences = Preferences::parse(preferences, channel_known).map_err(|bad| Invalid {
        field: if bad.field.is_empty() {
            "preferences".into()
        } else {
            format!("preferences.{}", bad.field)
        },
        error: bad.error,
    })?;
    let updated_at = match top.get("updated_at") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            DateTime::parse_from_rfc3339(s)
                .map_err(|e| invalid("updated_at", format!("not an RFC 3339 instant: {e}")))?
                .with_timezone(&Utc),
        ),
        Some(_) => return Err(invalid("updated_at", "must be an RFC 3339 instant")),
    };
    Ok(Line {
        recipient,
        tenant,
        preferences,
        updated_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use serde_json::json;

    fn known(ch: &str) -> bool {
        ["sms", "email"].contains(&ch)
    }

    #[test]
    fn a_written_line_reads_back_the_same() {
        let set = json!({"channels": {"sms": false}});
        let at = Utc.with_ymd_and_hms(2026, 11, 27, 1, 2, 3).unwrap();
        let line = write_line("r+1", Some("acme"), &set, at);
        assert_eq!(
            line,
            r#"{"recipient":"r+1","tenant":"acme","preferences":{"channels":{"sms":false}},"updated_at":"2026-11-27T01:02:03.000Z"}"#
        );
        let read = parse_line(&line, &known).unwrap();
        assert_eq!(read.recipient, "r+1");
        assert_eq!(read.tenant.as_deref(), Some("acme"));
        assert_eq!(read.preferences.to_json(), set);
        assert_eq!(read.updated_at, Some(at));
        let none = write_line("r", None, &set, at);
        assert!(none.contains(r#""tenant":null"#), "{none}");
        assert_eq!(parse_line(&none, &known).unwrap().tenant, None);
    }

    #[test]
    fn every_bad_line_names_its_field() {
        let cases = [
            ("{", ""),
            ("[]", ""),
            (r#"{"preferences":{}}"#, "recipient"),
            (r#"{"recipient":"","preferences":{}}"#, "recipient"),
            (r#"{"recipient":"r"}"#, "preferences"),
            (r#"{"recipient":"r","preferences":[]}"#, "preferences"),
            (r#"{"recipient":"r","tenant":3,"preferences":{}}"#, "tenant"),
            (r#"{"recipient":"r","preferences":{},"colour":1}"#, "colour"),
            (
                r#"{"recipient":"r","preferences":{"channels":{"fax":false}}}"#,
                "preferences.channels.fax",
            ),
            (
                r#"{"recipient":"r","preferences":{"quiet_hours":{"windows":[{"days":"daily","from":"25:00","to":"07:00"}]}}}"#,
                "preferences.quiet_hours.windows[0].from",
            ),
            (
                r#"{"recipient":"r","preferences":{},"updated_at":"yesterday"}"#,
                "updated_at",
            ),
        ];
        for (text, field) in cases {
            assert_eq!(parse_line(text, &known).unwrap_err().field, field, "{text}");
        }
    }
}
